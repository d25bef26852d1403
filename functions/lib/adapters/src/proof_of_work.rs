//! ALTCHA's proof of work (PoW v2, the official `altcha` crate) behind [`ProofOfWork`].
//!
//! Each challenge runs in ALTCHA's deterministic mode: the issuer draws the counter that
//! solves it, below the sale's work, derives that counter's key and hands out its first
//! half as the prefix to find; the solver derives keys from counter 0 until one starts
//! with it. The issuer also signs the whole key, so verifying is two HMACs (the
//! challenge's and the key's), not a derivation: cheap enough to refuse a flood of
//! forgeries in memory. The challenge's `data` binds it to the sale and the buyer, and
//! carries its issue time (the grab path's order is timed by it) and its work (so the
//! page can show honest progress).

use std::collections::BTreeMap;

use altcha::{
    Challenge, CreateChallengeOptions, Payload, Solution, VerifySolutionOptions, create_challenge,
    verify_solution,
};
use chrono::{DateTime, Utc};
use flashsale_domain::challenge::{
    ChallengeRefusal, ChallengeWork, IssuedChallenge, SolvedChallenge,
};
use flashsale_domain::ports::ProofOfWork;
use flashsale_domain::token::GrabTokenSigner;
use flashsale_domain::{SaleId, UserId};
use serde::Deserialize as _;
use serde_json::{Value, json};

/// The key derivation: PBKDF2 with HMAC-SHA-256, which every browser's WebCrypto runs
/// natively (`crypto.subtle.deriveBits`), so the page needs no hashing code of its own
/// and a bot gains little over it with a native one. A memory-hard derivation (Argon2id,
/// scrypt) would be fairer between a phone and a GPU, but browsers have none natively,
/// and the verifier below never derives anyway.
pub const ALGORITHM: &str = "PBKDF2/SHA-256";

/// PBKDF2 iterations per derivation. Small: the sale's work sets the solve time by the
/// number of derivations, and each derivation stays one short WebCrypto call the page
/// can count for its progress. One derivation at this cost takes tens of microseconds
/// on a server core (the bench's `challenge` group measures it), which is what a
/// verifier without the key signature would pay.
pub const DERIVATION_COST: u32 = 64;

/// Challenges signed with two keys derived from the grab-token secret (see
/// [`GrabTokenSigner::subkey`]): one for the challenge, one for its solution's key.
pub struct AltchaChallenges {
    challenge_secret: String,
    key_secret: String,
}

impl std::fmt::Debug for AltchaChallenges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AltchaChallenges(..)")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl AltchaChallenges {
    pub fn new(signer: &GrabTokenSigner) -> Self {
        Self {
            challenge_secret: hex(&signer.subkey("altcha challenge")),
            key_secret: hex(&signer.subkey("altcha derived key")),
        }
    }

    fn refusal(payload: &Payload, sale: &SaleId, user: &UserId) -> Option<ChallengeRefusal> {
        let data = payload.challenge.parameters.data.as_ref();
        let field = |key: &str| data.and_then(|data| data.get(key)).and_then(Value::as_str);
        (field("sale") != Some(sale.as_str()) || field("user") != Some(user.as_str()))
            .then_some(ChallengeRefusal::NotYours)
    }
}

impl ProofOfWork for AltchaChallenges {
    fn issue(
        &self,
        sale: &SaleId,
        user: &UserId,
        work: ChallengeWork,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> IssuedChallenge {
        let data = BTreeMap::from([
            ("sale".to_owned(), json!(sale.as_str())),
            ("user".to_owned(), json!(user.as_str())),
            ("issued".to_owned(), json!(now.timestamp_millis())),
            ("work".to_owned(), json!(work.derivations())),
        ]);
        let challenge = create_challenge(CreateChallengeOptions {
            algorithm: ALGORITHM.to_owned(),
            cost: DERIVATION_COST,
            counter: Some(rand::random_range(0..work.derivations())),
            data: Some(data),
            expires_at: Some(expires_at.timestamp()),
            hmac_signature_secret: Some(self.challenge_secret.clone()),
            hmac_key_signature_secret: Some(self.key_secret.clone()),
            ..CreateChallengeOptions::default()
        })
        // Only a malformed prefix or an unknown algorithm fails, neither of which this
        // issuer can produce.
        .expect("a PBKDF2 challenge in deterministic mode is always created");
        IssuedChallenge(serde_json::to_value(challenge).unwrap_or(Value::Null))
    }

    fn verify(
        &self,
        solution: &Value,
        sale: &SaleId,
        user: &UserId,
        now: DateTime<Utc>,
    ) -> Result<SolvedChallenge, ChallengeRefusal> {
        // Read in place: the token route's body is not copied to be read.
        let payload = Payload::deserialize(solution).map_err(|_| ChallengeRefusal::Malformed)?;
        let expires = payload.challenge.parameters.expires_at.unwrap_or(0);
        if expires <= now.timestamp() {
            return Err(ChallengeRefusal::Expired);
        }
        let verified = verify_solution(VerifySolutionOptions {
            hmac_key_signature_secret: Some(self.key_secret.clone()),
            ..VerifySolutionOptions::new(
                &payload.challenge,
                &payload.solution,
                &self.challenge_secret,
            )
        })
        .map_err(|_| ChallengeRefusal::Malformed)?;
        if verified.expired {
            return Err(ChallengeRefusal::Expired);
        }
        if verified.invalid_signature != Some(false) {
            return Err(ChallengeRefusal::Forged);
        }
        // Only a challenge this service signed gets here, so its data is as issued.
        if let Some(refusal) = Self::refusal(&payload, sale, user) {
            return Err(refusal);
        }
        if !verified.verified {
            return Err(ChallengeRefusal::Unsolved);
        }
        solved(&payload.challenge).ok_or(ChallengeRefusal::Malformed)
    }
}

/// What a verified challenge names: its nonce (16 random bytes of the issuer's) and
/// its issue time.
fn solved(challenge: &Challenge) -> Option<SolvedChallenge> {
    let nonce = &challenge.parameters.nonce;
    let mut challenge_id = [0u8; 16];
    if nonce.len() != 32 {
        return None;
    }
    for (index, byte) in challenge_id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(nonce.get(index * 2..index * 2 + 2)?, 16).ok()?;
    }
    let issued = challenge
        .parameters
        .data
        .as_ref()?
        .get("issued")?
        .as_i64()?;
    Some(SolvedChallenge {
        challenge_id,
        issued_at: DateTime::from_timestamp_millis(issued)?,
    })
}

/// Solves `challenge` as a client does, in Rust: for tests and for the load tool's
/// `--challenge` mode, which should pay what a bot pays. `None` if it cannot be read.
pub fn solve(challenge: &IssuedChallenge) -> Option<(Value, u32)> {
    let challenge: Challenge = serde_json::from_value(challenge.0.clone()).ok()?;
    let solution: Solution = altcha::solve_challenge(altcha::SolveChallengeOptions {
        timeout_ms: 0,
        ..altcha::SolveChallengeOptions::new(&challenge)
    })
    .ok()??;
    let derivations = solution.counter + 1;
    let payload = Payload {
        challenge,
        solution,
    };
    Some((serde_json::to_value(payload).ok()?, derivations))
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    fn challenges() -> AltchaChallenges {
        AltchaChallenges::new(&GrabTokenSigner::new(vec![7u8; 32]).unwrap())
    }

    fn ids() -> (SaleId, UserId) {
        (
            SaleId::parse("s1").unwrap(),
            UserId::parse("alice").unwrap(),
        )
    }

    fn issued(now: DateTime<Utc>) -> IssuedChallenge {
        let (sale, user) = ids();
        let work = ChallengeWork::of_setting("w", 2_000).unwrap().unwrap();
        challenges().issue(&sale, &user, work, now, now + Duration::minutes(5))
    }

    #[test]
    fn a_solved_challenge_verifies_for_its_buyer_and_names_the_same_challenge_each_time() {
        let now = Utc::now();
        let (sale, user) = ids();
        let (solution, derivations) = solve(&issued(now)).expect("solvable");
        assert!((1..=2_000).contains(&derivations), "{derivations}");
        let solved = challenges()
            .verify(&solution, &sale, &user, now)
            .expect("verified");
        assert_eq!(
            challenges().verify(&solution, &sale, &user, now),
            Ok(solved),
            "a replay names the same challenge"
        );
        assert_eq!(solved.issued_at.timestamp_millis(), now.timestamp_millis());
        let (again, _) = solve(&issued(now)).unwrap();
        assert_ne!(
            challenges().verify(&again, &sale, &user, now).unwrap(),
            solved,
            "another challenge is another"
        );
    }

    #[test]
    fn another_buyer_or_sale_a_later_time_or_another_key_is_refused() {
        let now = Utc::now();
        let (sale, user) = ids();
        let (solution, _) = solve(&issued(now)).unwrap();
        let bob = UserId::parse("bob").unwrap();
        assert_eq!(
            challenges().verify(&solution, &sale, &bob, now),
            Err(ChallengeRefusal::NotYours)
        );
        let other_sale = SaleId::parse("s2").unwrap();
        assert_eq!(
            challenges().verify(&solution, &other_sale, &user, now),
            Err(ChallengeRefusal::NotYours)
        );
        assert_eq!(
            challenges().verify(&solution, &sale, &user, now + Duration::minutes(6)),
            Err(ChallengeRefusal::Expired)
        );
        let other_key = AltchaChallenges::new(&GrabTokenSigner::new(vec![8u8; 32]).unwrap());
        assert_eq!(
            other_key.verify(&solution, &sale, &user, now),
            Err(ChallengeRefusal::Forged)
        );
    }

    #[test]
    fn a_tampered_challenge_or_a_wrong_key_is_refused() {
        let now = Utc::now();
        let (sale, user) = ids();
        let (solution, _) = solve(&issued(now)).unwrap();
        let mut rebound = solution.clone();
        rebound["challenge"]["parameters"]["data"]["user"] = json!("bob");
        let bob = UserId::parse("bob").unwrap();
        assert_eq!(
            challenges().verify(&rebound, &sale, &bob, now),
            Err(ChallengeRefusal::Forged)
        );
        let mut easier = solution.clone();
        easier["challenge"]["parameters"]["keyPrefix"] = json!("00");
        assert_eq!(
            challenges().verify(&easier, &sale, &user, now),
            Err(ChallengeRefusal::Forged)
        );
        let mut guessed = solution.clone();
        guessed["solution"]["derivedKey"] = json!("00".repeat(32));
        assert_eq!(
            challenges().verify(&guessed, &sale, &user, now),
            Err(ChallengeRefusal::Unsolved)
        );
        let unsolved =
            json!({"challenge": issued(now).0, "solution": {"counter": 0, "derivedKey": "zz"}});
        assert_eq!(
            challenges().verify(&unsolved, &sale, &user, now),
            Err(ChallengeRefusal::Unsolved)
        );
        for junk in [json!(null), json!("x"), json!({"challenge": 1})] {
            assert_eq!(
                challenges().verify(&junk, &sale, &user, now),
                Err(ChallengeRefusal::Malformed)
            );
        }
    }
}
