//! `sqlx::migrate!` embeds `migrations/` at compile time, but Cargo does not know the macro
//! read those files: without this, a change to a migration alone leaves the old set compiled in.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
