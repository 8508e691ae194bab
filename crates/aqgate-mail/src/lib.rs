//! The mail path: the SMTP ingestion filter (`smtp`), S/MIME verification, the spool and
//! the forwarding worker that posts verified IDAP requests to the servlet and mails the
//! responses back.

pub mod acceptor;
pub mod data;
pub mod extract;
pub mod limits;
pub mod outbound;
pub mod reinject;
pub mod smime;
pub mod smtp;
pub mod worker;
