-- Replies to re-sent copies, and encrypted replies.
-- resend_message_id: the Message-ID of the latest re-sent copy of a mail (a replay with new
-- outer headers): the response mailed again for it answers that copy (In-Reply-To).
-- encrypt_to: DER of the agent's directory certificate when a copy came encrypted; the
-- replies are then encrypted to it.
ALTER TABLE mail_spool ADD COLUMN resend_message_id TEXT;
ALTER TABLE mail_spool ADD COLUMN encrypt_to BYTEA;
