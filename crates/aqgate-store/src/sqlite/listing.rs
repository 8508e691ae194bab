//! `admin messages` and the views' copy of buffered messages on SQLite (see
//! `crate::listing`): a page's messages bound as JSON arrays (`json_each`).

use crate::*;

crate::listing::views_backend!(
    sqlx::SqlitePool,
    crate::views::Dialect::Sqlite,
    |s: &[i64]| serde_json::to_string(s).unwrap_or_else(|_| "[]".into()),
    [false]
);
