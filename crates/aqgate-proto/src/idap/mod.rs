//! IDAP: Oracle AQ's XML protocol (envelope + AQ XML access schema).
//!
//! * [`model`]: the typed requests and responses;
//! * [`parse`]: bytes to model, with limits and namespace checks ([`parse_request`],
//!   [`parse_response`], [`check_method_header`]);
//! * [`write`]: model to XML ([`write_response`], [`write_request`], [`write_node`]).

pub mod model;
pub mod parse;
pub mod write;

pub use model::*;
pub use parse::*;
pub use write::*;
