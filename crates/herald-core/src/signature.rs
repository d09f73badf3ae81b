//! Receipt signatures. A provider signs every receipt post with the secret Herald holds for its
//! gateway, so a receipt that nobody signed, or that another gateway's secret signed, is never
//! stored. One header carries the signature:
//!
//! ```text
//! Herald-Signature: t=<unix seconds>,v1=<hex of HMAC-SHA256(secret, "<t>." + body)>
//! ```
//!
//! computed over the exact bytes of the body. A post may carry several `v1=` entries (a
//! provider signing with its old and its new secret while they are rotated); one that matches a
//! secret of the gateway is enough. `t` must lie within the window of the verifier's clock, so
//! a captured post cannot be replayed later. Pure: the caller passes the time.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The header's name (HTTP header names are case-insensitive).
pub const HEADER: &str = "herald-signature";

/// How far `t` may be from the verifier's clock, either way, unless configured otherwise.
pub const DEFAULT_WINDOW_SECS: u64 = 300;

/// A header longer than this is refused unread: no provider needs more than a few entries.
const MAX_HEADER_BYTES: usize = 1024;
/// Most `v1=` entries one header may carry.
const MAX_SIGNATURES: usize = 8;

type HmacSha256 = Hmac<Sha256>;

/// Why a signature is refused. Each case is a `reason` label of the API's counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no Herald-Signature header")]
    Missing,
    #[error("the Herald-Signature header is not `t=<unix seconds>,v1=<64 hex digits>`")]
    Malformed,
    #[error("no v1 signature matches a secret of this gateway")]
    Mismatch,
    #[error("the signature's timestamp is outside the accepted window")]
    Stale,
}

impl SignatureError {
    /// The metric label of this case.
    pub fn reason(self) -> &'static str {
        match self {
            SignatureError::Missing => "missing",
            SignatureError::Malformed => "malformed",
            SignatureError::Mismatch => "mismatch",
            SignatureError::Stale => "stale",
        }
    }
}

/// The header value for `body` signed with `secret` at `timestamp` (Unix seconds).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac(secret, timestamp, body))
    )
}

/// Checks `header` (the value of [`HEADER`], if the request had one) over `body` against every
/// secret of the gateway, comparing in constant time and without stopping at the first match,
/// then checks that its timestamp is within `window_secs` of `now`.
pub fn verify<S: AsRef<[u8]>>(
    secrets: &[S],
    header: Option<&str>,
    body: &[u8],
    now: i64,
    window_secs: u64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let (timestamp, presented) = parse(header)?;
    let mut matched = subtle::Choice::from(0u8);
    for secret in secrets {
        let expected = mac(secret.as_ref(), timestamp, body);
        for signature in &presented {
            matched |= expected.ct_eq(signature);
        }
    }
    if !bool::from(matched) {
        return Err(SignatureError::Mismatch);
    }
    if now.abs_diff(timestamp) > window_secs {
        return Err(SignatureError::Stale);
    }
    Ok(())
}

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// `t=…` exactly once, one to [`MAX_SIGNATURES`] `v1=…` entries; other keys (a later scheme's
/// `v2=`) are ignored.
fn parse(header: &str) -> Result<(i64, Vec<[u8; 32]>), SignatureError> {
    if header.len() > MAX_HEADER_BYTES {
        return Err(SignatureError::Malformed);
    }
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        let (key, value) = part
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed)?;
        match key {
            "t" => {
                let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
                let parsed = value.parse::<i64>().ok().filter(|_| digits);
                if timestamp.is_some() || parsed.is_none() {
                    return Err(SignatureError::Malformed);
                }
                timestamp = parsed;
            }
            "v1" => {
                let mut signature = [0u8; 32];
                hex::decode_to_slice(value, &mut signature)
                    .map_err(|_| SignatureError::Malformed)?;
                signatures.push(signature);
            }
            _ => {}
        }
    }
    match timestamp {
        Some(t) if !signatures.is_empty() && signatures.len() <= MAX_SIGNATURES => {
            Ok((t, signatures))
        }
        _ => Err(SignatureError::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_760_000_000;
    const BODY: &[u8] = br#"{"provider_id":"7","status":"DELIVRD","timestamp":1760000000}"#;

    #[test]
    fn a_signature_made_with_a_secret_of_the_gateway_verifies() {
        let header = sign(b"secret-one", NOW, BODY);
        assert!(header.starts_with(&format!("t={NOW},v1=")));
        assert_eq!(header.len(), format!("t={NOW},v1=").len() + 64);
        let secrets = [b"secret-zero".as_slice(), b"secret-one".as_slice()];
        assert_eq!(verify(&secrets, Some(&header), BODY, NOW, 300), Ok(()));
        // Within the window either way (the provider's clock may run ahead).
        assert_eq!(
            verify(&secrets, Some(&header), BODY, NOW - 300, 300),
            Ok(())
        );
        assert_eq!(
            verify(&secrets, Some(&header), BODY, NOW + 300, 300),
            Ok(())
        );
    }

    #[test]
    fn a_known_vector_stays_the_same() {
        // printf '1760000000.{}' | openssl dgst -sha256 -hmac key
        assert_eq!(
            sign(b"key", NOW, b"{}"),
            "t=1760000000,v1=5f2db4fbfe82c254ac32f1ccc5eff02389f2609d76031aa8b300fac9565df6f6"
        );
    }

    #[test]
    fn any_change_to_the_body_the_time_or_the_secret_is_a_mismatch() {
        let header = sign(b"secret-one", NOW, BODY);
        let mut changed = BODY.to_vec();
        changed[20] ^= 1;
        let one = [b"secret-one"];
        assert_eq!(
            verify(&one, Some(&header), &changed, NOW, 300),
            Err(SignatureError::Mismatch)
        );
        let other_time = header.replacen(&NOW.to_string(), &(NOW + 1).to_string(), 1);
        assert_eq!(
            verify(&one, Some(&other_time), BODY, NOW, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&[b"secret-two"], Some(&header), BODY, NOW, 300),
            Err(SignatureError::Mismatch)
        );
        let none: [&[u8]; 0] = [];
        assert_eq!(
            verify(&none, Some(&header), BODY, NOW, 300),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn a_signature_outside_the_window_is_stale() {
        let header = sign(b"secret-one", NOW, BODY);
        let one = [b"secret-one"];
        assert_eq!(
            verify(&one, Some(&header), BODY, NOW + 301, 300),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify(&one, Some(&header), BODY, NOW - 301, 300),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn several_signatures_rotate_secrets() {
        let old = sign(b"old-secret", NOW, BODY);
        let new = sign(b"new-secret", NOW, BODY);
        let both = format!("{old}, v1={}", new.rsplit_once("v1=").unwrap().1);
        assert_eq!(
            verify(&[b"new-secret"], Some(&both), BODY, NOW, 300),
            Ok(())
        );
        assert_eq!(
            verify(&[b"old-secret"], Some(&both), BODY, NOW, 300),
            Ok(())
        );
        // A later scheme's entries are ignored, not refused.
        let later = format!("{new},v2=abc");
        assert_eq!(
            verify(&[b"new-secret"], Some(&later), BODY, NOW, 300),
            Ok(())
        );
    }

    #[test]
    fn headers_that_are_not_the_format_are_malformed() {
        let one = [b"secret-one"];
        assert_eq!(
            verify(&one, None, BODY, NOW, 300),
            Err(SignatureError::Missing)
        );
        let good = hex::encode(mac(b"secret-one", NOW, BODY));
        for header in [
            String::new(),
            "garbage".to_owned(),
            format!("v1={good}"),
            format!("t={NOW}"),
            format!("t=-{NOW},v1={good}"),
            format!("t=+{NOW},v1={good}"),
            format!("t={NOW},t={NOW},v1={good}"),
            format!("t={NOW},v1={}", &good[..62]),
            format!("t={NOW},v1={}zz", &good[..62]),
            format!("t=99999999999999999999,v1={good}"),
            format!("t={NOW},{}", vec![format!("v1={good}"); 9].join(",")),
            format!("t={NOW},v1={good},{}", "x".repeat(1024)),
        ] {
            assert_eq!(
                verify(&one, Some(&header), BODY, NOW, 300),
                Err(SignatureError::Malformed),
                "{header:?}"
            );
        }
    }
}
