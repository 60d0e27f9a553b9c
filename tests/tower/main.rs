//! The tower layer through real axum routers, tonic servers and raw TCP.

mod behaviour;
mod client_ip;
mod fuzz_corpus;
mod grpc;
mod headers;
mod jwt;
mod support;
