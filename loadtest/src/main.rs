//! `herald-loadtest`: the open-loop load generator with its proof of delivery is not built
//! yet. Until it is, `herald dev` sends a demo load and `herald verify` proves delivery.

fn main() {
    eprintln!(
        "herald-loadtest is not built yet: run `herald dev --messages N` for a load with its \
         proof, and `herald verify` against a running deployment"
    );
    std::process::exit(2);
}
