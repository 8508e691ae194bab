//! The protocol of aqgate, with no I/O: IDAP (Oracle AQ's XML protocol) model, parser and
//! writer; payload kinds and their validation; the AQ condition language; fault codes and
//! the header and cookie names clients share. Nothing here can reach the network, a
//! database or a clock (its dependency tree holds none of them).

pub mod code;
pub mod idap;
pub mod names;
pub mod payload;
pub mod selector;
pub mod value;
mod xml;
