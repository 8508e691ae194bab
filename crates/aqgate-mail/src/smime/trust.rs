//! The trust store S/MIME verification uses: CA certificates (the only trust anchors), CRLs
//! (of those CAs, and of intermediates that mails carry), and the chains already verified.

use super::*;

/// The trusted CA certificates (roots and intermediates) and the CRLs checked against.
/// Not `Clone` (OpenSSL CRLs are not): share it behind an `Arc`.
pub struct TrustStore {
    pub(super) cas: Vec<X509>,
    pub(super) crls: Vec<TrustedCrl>,
    /// Chains already built, by SHA-256 of the signer's DER (see [`verify_chain`]).
    pub(super) chains: std::sync::Mutex<std::collections::HashMap<[u8; 32], CachedChain>>,
}

/// A chain that verified, and the time window in which every certificate of it is valid:
/// inside it, OpenSSL's verdict for the same certificate and CAs cannot change (revocation
/// is checked separately, on every mail). It holds for a later mail only if that mail
/// carries the intermediates the chain took from its mail: a mail's verdict never depends
/// on what earlier mails carried.
pub(super) struct CachedChain {
    chain: Vec<X509>,
    from: i64,
    until: i64,
    /// DER of the chain's certificates that came from the mail (neither the signer nor a
    /// trusted CA).
    carried: Vec<Vec<u8>>,
}

pub(super) struct TrustedCrl {
    crl: X509Crl,
    /// DER of the trusted CA whose key signed this CRL; `None` for a CRL no trusted CA
    /// issued: an intermediate's, which a mail carries. It applies to a chain whose
    /// intermediate has its issuer's name and the key its signature verifies with.
    issuer_der: Option<Vec<u8>>,
}

impl std::fmt::Debug for TrustStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cas: Vec<String> = self.cas.iter().map(|ca| name_string(ca.subject_name())).collect();
        f.debug_struct("TrustStore").field("cas", &cas).field("crls", &self.crls.len()).finish()
    }
}

impl TrustStore {
    /// Reads CA certificate files (PEM, several per file allowed, or DER) and CRL files (PEM or DER).
    pub fn from_pem_files(cas: &[PathBuf], crls: &[PathBuf]) -> Result<Self, String> {
        let read = |path: &PathBuf| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
        let ca_bytes = cas.iter().map(read).collect::<Result<Vec<_>, _>>()?;
        let crl_bytes = crls.iter().map(read).collect::<Result<Vec<_>, _>>()?;
        let ca_refs: Vec<&[u8]> = ca_bytes.iter().map(Vec::as_slice).collect();
        let crl_refs: Vec<&[u8]> = crl_bytes.iter().map(Vec::as_slice).collect();
        Self::from_pem(&ca_refs, &crl_refs)
    }

    /// CA certificates and CRLs from memory. Every CRL must be signed by one of the CAs.
    pub fn from_pem(cas: &[&[u8]], crls: &[&[u8]]) -> Result<Self, String> {
        let mut ca_certs = Vec::new();
        for (i, bytes) in cas.iter().enumerate() {
            let parsed =
                if is_pem(bytes) { X509::stack_from_pem(bytes) } else { X509::from_der(bytes).map(|c| vec![c]) };
            let parsed =
                parsed.map_err(|e| format!("trusted CA #{}: not a certificate: {}", i + 1, first_error(&e)))?;
            if parsed.is_empty() {
                return Err(format!("trusted CA #{}: no certificate found", i + 1));
            }
            ca_certs.extend(parsed);
        }
        if ca_certs.is_empty() {
            return Err("no trusted CA certificate configured".to_string());
        }
        let mut trusted_crls = Vec::new();
        for (i, bytes) in crls.iter().enumerate() {
            for crl in parse_crls(bytes).map_err(|e| format!("CRL #{}: {e}", i + 1))? {
                let named: Vec<&X509> =
                    ca_certs.iter().filter(|ca| same_name(ca.subject_name(), crl.issuer_name())).collect();
                let issuer_der = if named.is_empty() {
                    // Not a trusted CA's: an intermediate's, checked against the
                    // intermediate that a chain holds.
                    None
                } else {
                    let issuer = named
                        .iter()
                        .find(|ca| ca.public_key().and_then(|key| crl.verify(&key)).unwrap_or(false))
                        .ok_or_else(|| {
                            format!(
                                "CRL #{} (issuer {}) is not signed by the trusted CA of that name",
                                i + 1,
                                name_string(crl.issuer_name())
                            )
                        })?;
                    Some(issuer.to_der().map_err(|e| format!("CRL #{}: {}", i + 1, first_error(&e)))?)
                };
                trusted_crls.push(TrustedCrl { crl, issuer_der });
            }
        }
        Ok(TrustStore { cas: ca_certs, crls: trusted_crls, chains: Default::default() })
    }

    /// An OpenSSL store for one verification: the CAs, the S/MIME signing purpose, time `now`.
    pub(super) fn x509_store(&self, now: i64) -> Result<X509Store, openssl::error::ErrorStack> {
        let mut builder = X509StoreBuilder::new()?;
        for ca in &self.cas {
            builder.add_cert(ca.clone())?;
        }
        let mut param = X509VerifyParam::new()?;
        param.set_time(now);
        param.set_purpose(X509PurposeId::SMIME_SIGN)?;
        builder.set_param(&param)?;
        Ok(builder.build())
    }

    /// The issuers of configured CRLs that no trusted CA issued (intermediates' CRLs), for
    /// the operator's log.
    pub fn intermediate_crl_issuers(&self) -> Vec<String> {
        self.crls.iter().filter(|c| c.issuer_der.is_none()).map(|c| name_string(c.crl.issuer_name())).collect()
    }
}

/// Chain to a trusted CA at the store's time with the S/MIME signing purpose; the built chain
/// (leaf first) on success. `carried` are the certificates the mail carries (DER): untrusted,
/// offered to path building as intermediates only (parsed only when a chain is built). A
/// chain that verified is remembered with the window in which all its certificates are
/// valid, and reused for the same signer at a time inside it: building and checking the
/// chain (the CA's signature over the certificate) is a fifth of a verification, and a
/// sender's certificate is the same mail after mail.
pub(super) fn verify_chain(
    trust: &TrustStore,
    store: &X509Store,
    signer: &X509,
    carried: &[&[u8]],
    now: i64,
) -> Result<Vec<X509>, Verdict> {
    let key = signer.to_der().map(|der| openssl::sha::sha256(&der)).map_err(|e| temp(first_error(&e)))?;
    let cached = |chains: &std::collections::HashMap<[u8; 32], CachedChain>| {
        chains
            .get(&key)
            .filter(|c| c.from <= now && now <= c.until)
            .filter(|c| c.carried.iter().all(|der| carried.contains(&der.as_slice())))
            .map(|c| c.chain.clone())
    };
    if let Some(chain) = cached(&trust.chains.lock().unwrap_or_else(|p| p.into_inner())) {
        return Ok(chain);
    }
    let signer_der = signer.to_der().map_err(|e| temp(first_error(&e)))?;
    let mut untrusted = Stack::new().map_err(|e| temp(first_error(&e)))?;
    for der in carried.iter().filter(|der| **der != signer_der.as_slice()).take(MAX_CARRIED) {
        // One that does not parse cannot be part of any chain.
        if let Ok(cert) = X509::from_der(der) {
            untrusted.push(cert).map_err(|e| temp(first_error(&e)))?;
        }
    }
    let mut context = X509StoreContext::new().map_err(|e| temp(first_error(&e)))?;
    let (ok, error, chain) = context
        .init(store, signer, &untrusted, |ctx| {
            let ok = ctx.verify_cert()?;
            let chain: Vec<X509> = ctx.chain().map(|c| c.iter().map(|x| x.to_owned()).collect()).unwrap_or_default();
            Ok((ok, ctx.error(), chain))
        })
        .map_err(|e| temp(format!("certificate verification failed to run: {}", first_error(&e))))?;
    if !ok {
        return Err(fail(format!("the signer certificate is not acceptable: {}", error.error_string())));
    }
    let from =
        chain.iter().map(|c| asn1_unix(c.not_before())).collect::<Option<Vec<i64>>>().and_then(|v| v.into_iter().max());
    let until =
        chain.iter().map(|c| asn1_unix(c.not_after())).collect::<Option<Vec<i64>>>().and_then(|v| v.into_iter().min());
    let trusted: Vec<Vec<u8>> = trust.cas.iter().filter_map(|ca| ca.to_der().ok()).collect();
    let from_mail: Vec<Vec<u8>> =
        chain.iter().skip(1).filter_map(|c| c.to_der().ok()).filter(|der| !trusted.contains(der)).collect();
    if let (Some(from), Some(until)) = (from, until) {
        let mut chains = trust.chains.lock().unwrap_or_else(|p| p.into_inner());
        if chains.len() >= 4096 {
            chains.clear();
        }
        chains.insert(key, CachedChain { chain: chain.clone(), from, until, carried: from_mail });
    }
    Ok(chain)
}

/// At most this many carried certificates are offered to path building.
const MAX_CARRIED: usize = 16;

/// An ASN.1 time as unix seconds.
pub(super) fn asn1_unix(t: &openssl::asn1::Asn1TimeRef) -> Option<i64> {
    let diff = Asn1Time::from_unix(0).ok()?.diff(t).ok()?;
    Some(i64::from(diff.days) * 86_400 + i64::from(diff.secs))
}

/// Every certificate of `chain` (leaf first) but the trust anchor against the CRLs of its
/// issuer: a trusted CA's (`--smime-crl`), or an intermediate's (a configured CRL of its
/// name whose signature its key verifies). An issuer without a configured CRL is not
/// revocation-checked; one whose CRLs are all stale at `now` gives `TempError`.
pub(super) fn check_revocation(trust: &TrustStore, chain: &[X509], now: i64) -> Result<(), Verdict> {
    let now_asn1 = Asn1Time::from_unix(now).map_err(|e| temp(first_error(&e)))?;
    for (i, pair) in chain.windows(2).enumerate() {
        let [cert, issuer] = pair else { continue };
        let issuer_der = issuer.to_der().map_err(|e| temp(first_error(&e)))?;
        let is_anchor = trust.cas.iter().any(|ca| ca.to_der().is_ok_and(|d| d == issuer_der));
        let crls: Vec<&X509Crl> = trust
            .crls
            .iter()
            .filter(|c| match &c.issuer_der {
                Some(der) => *der == issuer_der,
                None => {
                    !is_anchor
                        && same_name(issuer.subject_name(), c.crl.issuer_name())
                        && issuer.public_key().and_then(|key| c.crl.verify(&key)).unwrap_or(false)
                }
            })
            .map(|c| &c.crl)
            .collect();
        if crls.is_empty() {
            continue;
        }
        let current: Vec<&&X509Crl> = crls
            .iter()
            .filter(|crl| {
                let started = crl.last_update().compare(&now_asn1).is_ok_and(|o| o.is_le());
                let fresh = crl.next_update().is_none_or(|next| next.compare(&now_asn1).is_ok_and(|o| o.is_ge()));
                started && fresh
            })
            .collect();
        if current.is_empty() {
            return Err(temp(format!(
                "revocation status unknown: no CRL of {} is current at arrival time",
                name_string(issuer.subject_name())
            )));
        }
        for crl in current {
            if let CrlStatus::Revoked(_) = crl.get_by_cert(cert) {
                let serial = cert
                    .serial_number()
                    .to_bn()
                    .and_then(|bn| bn.to_hex_str().map(|s| s.to_string()))
                    .unwrap_or_default();
                let what = if i == 0 {
                    "the signer certificate".to_string()
                } else {
                    format!("the intermediate CA certificate {}", name_string(cert.subject_name()))
                };
                return Err(fail(format!("{what} (serial {serial}) is revoked")));
            }
        }
    }
    Ok(())
}

pub(super) fn is_pem(bytes: &[u8]) -> bool {
    bytes.windows(11).any(|w| w == b"-----BEGIN ")
}

pub(super) fn parse_crls(bytes: &[u8]) -> Result<Vec<X509Crl>, String> {
    if !is_pem(bytes) {
        return X509Crl::from_der(bytes).map(|c| vec![c]).map_err(|e| format!("not a CRL: {}", first_error(&e)));
    }
    const BEGIN: &[u8] = b"-----BEGIN X509 CRL-----";
    let mut crls = Vec::new();
    let mut rest = bytes;
    while let Some(start) = rest.windows(BEGIN.len()).position(|w| w == BEGIN) {
        let block = rest.get(start..).unwrap_or_default();
        let next = block.get(1..).and_then(|b| b.windows(BEGIN.len()).position(|w| w == BEGIN)).map(|p| p + 1);
        let this = next.and_then(|n| block.get(..n)).unwrap_or(block);
        crls.push(X509Crl::from_pem(this).map_err(|e| format!("not a CRL: {}", first_error(&e)))?);
        rest = next.and_then(|n| block.get(n..)).unwrap_or_default();
    }
    if crls.is_empty() {
        return Err("no X509 CRL block found".to_string());
    }
    Ok(crls)
}

pub(super) fn same_name(a: &X509NameRef, b: &X509NameRef) -> bool {
    matches!((a.to_der(), b.to_der()), (Ok(a), Ok(b)) if a == b)
}

pub(super) fn name_string(name: &X509NameRef) -> String {
    let parts: Vec<String> = name
        .entries()
        .map(|entry| {
            let key = entry.object().nid().short_name().unwrap_or("?");
            let value = entry.data().to_string().unwrap_or_default();
            format!("{key}={value}")
        })
        .collect();
    parts.join(", ")
}
