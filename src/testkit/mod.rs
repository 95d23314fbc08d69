//! Synthetic inputs for tests, benches and the benchmark tools, behind the `testkit`
//! feature: nothing on the request path imports this module.

pub mod fleet;
