//! The hostlb allocator: assigns addresses from IPAddressPools to
//! LoadBalancer Services.
#![forbid(unsafe_code)]

pub mod controller;
pub mod convert;
pub mod engine;
pub mod inputs;
pub mod ledger;
pub mod plan;
