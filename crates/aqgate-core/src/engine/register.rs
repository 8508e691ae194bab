//! AQXmlRegister: registrations for notifications and the notify_url checks.

use super::*;
use crate::error::{AqError, code};
use crate::idap::model::*;
use crate::notify_policy::MailRefusal;
use crate::store::*;
use crate::topology::{AgentInfo, Privilege};

impl Engine {
    pub(super) async fn register(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        agent: &AgentInfo,
        req: RegisterRequest,
    ) -> Result<(), AqError> {
        let dest = self.destination_name(&req.destination).await?;
        let (queue, qid) = resolved.queue(&dest)?;
        not_remote(queue, agent, "registering for notifications on")?;
        if !resolved.catalog.permits(agent, queue, Privilege::Dequeue) {
            return Err(not_permitted(agent, "register for notifications on", &queue.name));
        }
        let consumer = consumer_for(queue, req.consumer_name.as_deref())?;
        let url = req.notify_url.trim();
        if !url.is_empty() {
            self.check_notify_url(url).await?;
        }
        let mut tx = self.store.begin().await?;
        if url.is_empty() {
            // `<notify_url/>` (empty): unregister. Undelivered notifications go with it.
            // (The queue stays in `registered` until the next refresh: a spurious wake-up
            // at worst.)
            tx.delete_registration(qid, &consumer, &agent.name).await?;
        } else {
            self.registered.write().unwrap_or_else(|p| p.into_inner()).insert(qid);
            tx.upsert_registration(&Registration {
                queue: qid,
                consumer,
                notify_url: url.to_string(),
                agent: agent.name.clone(),
            })
            .await?;
        }
        let mut next = session.state();
        if req.commit {
            next.end_transaction();
        }
        let response = Response::Register(StatusResponse::ok());
        let version = self.seal(&mut *tx, session, &next, Some(&response)).await?;
        let mut woken = Vec::new();
        if req.commit && session.pending {
            woken = publish(&mut *tx, resolved, session, session.dequeued).await?;
        }
        self.commit_tx(tx).await?;
        self.settle(session, next, version);
        for q in woken {
            self.wake(q);
        }
        Ok(())
    }

    /// Checks a registration's notify_url: `http(s)://` allowed by the notification policy,
    /// or `mailto:` with an address the mail policy allows or a directory notification alias.
    pub(super) async fn check_notify_url(&self, url: &str) -> Result<(), AqError> {
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("plsql://") {
            return Err(AqError::invalid("plsql:// notifications are not supported: use http(s):// or mailto:"));
        }
        if url.len() > 2048 {
            return Err(AqError::invalid("notify_url is longer than 2048 characters"));
        }
        if lower.starts_with("http://") || lower.starts_with("https://") {
            let host = crate::notify_policy::http_target_host(url).map_err(AqError::invalid)?;
            return self.config.notify_policy.check_host(&host).map_err(|e| AqError::client(code::NOT_PERMITTED, e));
        }
        let Some(addr) = lower.strip_prefix("mailto:").map(|a| a.trim_start_matches("//").trim()) else {
            return Err(AqError::invalid(format!("notify_url '{url}' is not an http(s):// URL or a mailto: address")));
        };
        if addr.contains('@') {
            if addr.starts_with('@') || addr.ends_with('@') || !crate::notify_policy::is_mail_address(addr) {
                return Err(AqError::invalid(format!("notify_url '{url}' is not a valid mailto: address")));
            }
            return match self.config.notify_mail_policy.check(addr, self.config.directory.as_deref()).await {
                Ok(()) => Ok(()),
                Err(MailRefusal::NotAllowed(why)) => Err(AqError::client(code::NOT_PERMITTED, why)),
                Err(MailRefusal::Directory(e)) => Err(AqError::directory(e, &format!("the mail address {addr}"))),
            };
        }
        // No '@': a notification alias the directory resolves (again at each delivery).
        let alias = url["mailto:".len()..].trim_start_matches("//").trim();
        if alias.is_empty() || !alias.chars().all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-')) {
            return Err(AqError::invalid(format!(
                "notify_url '{url}' is neither a mailto: address nor a notification alias (letters, digits, . _ -)"
            )));
        }
        let Some(dir) = &self.config.directory else {
            return Err(AqError::client(
                code::DIRECTORY,
                format!("mailto:{alias} is a notification alias, and no directory is configured"),
            ));
        };
        match dir.resolve_notification_alias(alias).await {
            Ok(_) => Ok(()),
            Err(crate::directory::DirectoryError::NotFound(_)) => {
                Err(AqError::client(code::DIRECTORY, format!("notification alias {alias} not found in the directory")))
            }
            Err(e) => Err(AqError::directory(e, &format!("notification alias {alias}"))),
        }
    }
}
