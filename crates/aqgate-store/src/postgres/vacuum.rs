//! The store's own vacuuming on PostgreSQL (`Store::vacuum`): a queue's rows are inserted
//! and deleted at the rate of its messages, so its table and indexes fill with dead rows
//! that every head read steps over until a VACUUM clears them; a table filled since its
//! statistics were gathered is planned as the small one it was until an ANALYZE. Where
//! autovacuum is off (or behind), nothing else would do either. One process at a time (a
//! session-level advisory lock, not waited for), only the tables of this store (a fixed
//! list: no name from the database is ever written into a statement), `VACUUM (ANALYZE,
//! SKIP_LOCKED)` (or `ANALYZE (SKIP_LOCKED)` alone) so that a table autovacuum or another
//! maintenance holds is left for the next turn; a plain VACUUM blocks no read or write of
//! the table.

use std::time::Instant;

use aqgate_core::store::{Result, Vacuumed};
use sqlx::PgPool;

use crate::Db;

/// The tables whose rows come and go: messages and their deliveries, the sessions and
/// their records, the spool, notifications, the gateway's records, the write probe.
const TABLES: &[&str] = &[
    "messages",
    "deliveries",
    "buffered_messages",
    "dequeue_history",
    "processed_messages",
    "sessions",
    "session_tombstones",
    "idempotency",
    "mail_spool",
    "notify_outbox",
    "gateway_doubt",
    "gateway_seen",
    "gateway_agents",
    "gateway_links",
    "propagation_jobs",
    "control_plane",
    "saml_replay",
    "store_probe",
];

/// A table is analyzed once the rows changed since its statistics were gathered number at
/// least this many …
pub const ANALYZE_MIN_CHANGED: i64 = 10_000;
/// … and this fraction of its live rows (autovacuum's default analyze scale factor).
pub const ANALYZE_FRACTION: f64 = 0.1;
/// … and its statistics were last gathered (by anyone: an ANALYZE, a VACUUM (ANALYZE),
/// autovacuum) at least this many seconds ago: a busy queue's table changes by 10,000
/// rows within one look, and is not analyzed at every one (autovacuum's pace is a minute).
pub const ANALYZE_EVERY_SECS: f64 = 60.0;

/// The advisory lock one vacuuming process holds (`aqgatevc` in ASCII).
const LOCK: i64 = 0x6171_6761_7465_7663;

pub(super) async fn vacuum(pool: &PgPool, min_dead: i64, fraction: f64) -> Result<Vec<Vacuumed>> {
    let mut conn = pool.acquire().await.db()?;
    let mine: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(LOCK).fetch_one(&mut *conn).await.db()?;
    if !mine {
        return Ok(Vec::new());
    }
    let done = vacuum_locked(&mut conn, min_dead, fraction).await;
    // The lock ends with the connection too, should this fail.
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)").bind(LOCK).execute(&mut *conn).await;
    done
}

async fn vacuum_locked(conn: &mut sqlx::PgConnection, min_dead: i64, fraction: f64) -> Result<Vec<Vacuumed>> {
    // Due for a vacuum (which analyzes too), else for an analyze alone: a table filled by
    // inserts has no dead rows, yet its statistics still say it is small, and the views'
    // and listings' plans go by them.
    let due: Vec<(String, i64, i64, i64, bool)> = sqlx::query_as(
        "SELECT relname::text, n_live_tup, n_dead_tup, n_mod_since_analyze,
                n_dead_tup >= $2 AND n_dead_tup >= n_live_tup * $3
           FROM pg_stat_user_tables
          WHERE schemaname = current_schema() AND relname = ANY($1)
            AND ((n_dead_tup >= $2 AND n_dead_tup >= n_live_tup * $3)
                 OR (n_mod_since_analyze >= $4 AND n_mod_since_analyze >= n_live_tup * $5
                     AND coalesce(greatest(last_analyze, last_autoanalyze), '-infinity')
                         < now() - make_interval(secs => $6)))
          ORDER BY 5 DESC, n_dead_tup DESC",
    )
    .bind(TABLES)
    .bind(min_dead)
    .bind(fraction)
    .bind(ANALYZE_MIN_CHANGED)
    .bind(ANALYZE_FRACTION)
    .bind(ANALYZE_EVERY_SECS)
    .fetch_all(&mut *conn)
    .await
    .db()?;
    let mut done = Vec::new();
    for (name, live, dead, changed, vacuum) in due {
        let Some(table) = TABLES.iter().copied().find(|t| *t == name) else { continue };
        let began = Instant::now();
        // VACUUM runs outside a transaction block: a statement without arguments goes by
        // the simple protocol, alone.
        let statement = if vacuum {
            format!("VACUUM (ANALYZE, SKIP_LOCKED) {table}")
        } else {
            format!("ANALYZE (SKIP_LOCKED) {table}")
        };
        sqlx::Executor::execute(&mut *conn, statement.as_str()).await.db()?;
        done.push(Vacuumed { table, live, dead, changed, vacuumed: vacuum, took: began.elapsed() });
    }
    Ok(done)
}
