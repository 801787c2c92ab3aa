//! Why a reconcile produced no plan: [`ReconcileError`] (from the
//! `wasmop-contract` crate).

pub use wasmop_contract::ReconcileError;
