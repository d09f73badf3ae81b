//! Herald end to end: the built `herald` binary's roles as separate processes against real
//! PostgreSQL, Redis and etcd servers and the provider simulator.

mod bulkheads;
mod cli;
mod deployment;
mod fleet;
mod observability;
mod pipeline;
mod rules;

pub use deployment::{Deployment, Options};
