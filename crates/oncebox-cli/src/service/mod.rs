//! `oncebox relay` and `oncebox receive`: the long-running services.
//!
//! Both connect to the store and the broker first (either unreachable is a configuration
//! error, status 2), install the Prometheus recorder before the engines register their
//! metrics, serve `/metrics`, `/healthz` and `/readyz`, and stop gracefully on SIGTERM
//! or SIGINT (see [`stop`]).

pub(crate) mod backend;
mod http;
mod receive;
mod relay;
mod stop;

pub(crate) use receive::{ReceiveArgs, receive};
pub(crate) use relay::relay;
