//! `admin messages` and the views' copy of buffered messages on PostgreSQL (see
//! `crate::listing`): a page's messages bound as arrays.

use crate::*;

crate::listing::views_backend!(sqlx::PgPool, crate::views::Dialect::Postgres, |s: &[i64]| s.to_vec(), [true, false]);
