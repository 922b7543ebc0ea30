//! Tests against a real kube-apiserver and etcd, started by `support`.
//!
//! One binary, so one shared control plane serves every test; each test uses unique names.

mod chart;
mod controller;
mod conversion;
mod discovery;
mod engine;
mod faults;
mod flags;
mod fleet;
mod foundation;
mod ha;
mod image;
mod inspect;
mod migrate;
mod observability;
mod plan;
mod readme;
mod real_crds;
mod release;
mod removal;
mod retry;
mod startup;
mod status;
mod storedversions;
mod support;
