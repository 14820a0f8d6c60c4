//! The Workspace controller's pure pieces: the objects of the `pod` runtime ([`pod`]).

pub mod controller;
pub mod pod;
