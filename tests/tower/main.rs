//! The tower layer through real axum routers, tonic servers and raw TCP.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod behaviour;
mod carry;
mod client_ip;
mod edges_policy;
mod fuzz_corpus;
mod grpc;
mod headers;
mod jwt;
mod policy;
mod policy_plans;
mod settle;
mod support;
mod tenant;
mod wait;
