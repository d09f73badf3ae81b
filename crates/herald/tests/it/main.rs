//! Herald end to end: the built `herald` binary's roles as separate processes against real
//! PostgreSQL, Redis and etcd servers and the provider simulator.

mod auth;
mod bulkheads;
mod claims;
mod cli;
mod deployment;
mod fleet;
mod observability;
mod pipeline;
mod rolling;
mod rules;
mod tls;
mod wait;

pub use deployment::{Deployment, Options};
