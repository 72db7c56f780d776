//! Deterministic random numbers and key distributions.
//!
//! A seeded xorshift RNG keeps runs reproducible and allocation free. Zipf
//! uses a precomputed CDF (O(keys) memory once, O(log keys) per draw), which
//! is exact for any skew, including s <= 1.

#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Every key equally likely.
    Uniform,
    /// Zipf with exponent `s`: key rank r has weight 1 / r^s.
    Zipf(f64),
    /// Every client hammers key 0.
    Hot,
    /// Client i always uses key i (modulo the key space): uncontended by construction.
    Private,
}

impl Dist {
    pub fn parse(s: &str) -> Result<Dist, String> {
        match s {
            "uniform" => Ok(Dist::Uniform),
            "hot" => Ok(Dist::Hot),
            "private" => Ok(Dist::Private),
            _ => match s.strip_prefix("zipf:").or_else(|| s.strip_prefix("zipf=")) {
                Some(v) => {
                    let skew: f64 = v.parse().map_err(|_| format!("bad zipf skew {v:?}"))?;
                    if !(skew > 0.0 && skew.is_finite()) {
                        return Err(format!("zipf skew must be > 0, got {v}"));
                    }
                    Ok(Dist::Zipf(skew))
                }
                None if s == "zipf" => Ok(Dist::Zipf(0.99)),
                None => Err(format!(
                    "bad --dist {s:?} (uniform | zipf:S | hot | private)"
                )),
            },
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Dist::Uniform => "uniform".into(),
            Dist::Zipf(s) => format!("zipf:{s}"),
            Dist::Hot => "hot".into(),
            Dist::Private => "private".into(),
        }
    }
}

/// xorshift64* seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(if z == 0 { 1 } else { z })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Draws key indices in `0..keys` according to a [`Dist`].
pub struct KeyPicker {
    dist: Dist,
    keys: u32,
    zipf_cdf: Vec<f64>,
}

impl KeyPicker {
    pub fn new(dist: Dist, keys: u32) -> KeyPicker {
        assert!(keys > 0, "key space must not be empty");
        let zipf_cdf = match dist {
            Dist::Zipf(s) => {
                let mut acc = 0.0;
                let mut cdf: Vec<f64> = (1..=keys)
                    .map(|r| {
                        acc += 1.0 / (r as f64).powf(s);
                        acc
                    })
                    .collect();
                let total = acc;
                for v in &mut cdf {
                    *v /= total;
                }
                cdf
            }
            _ => Vec::new(),
        };
        KeyPicker {
            dist,
            keys,
            zipf_cdf,
        }
    }

    pub fn pick(&self, rng: &mut Rng, client: usize) -> u32 {
        match self.dist {
            Dist::Uniform => rng.below(self.keys as u64) as u32,
            Dist::Hot => 0,
            Dist::Private => (client % self.keys as usize) as u32,
            Dist::Zipf(_) => {
                let u = rng.next_f64();
                let i = self.zipf_cdf.partition_point(|&c| c < u);
                i.min(self.keys as usize - 1) as u32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!(Dist::parse("uniform").unwrap(), Dist::Uniform);
        assert_eq!(Dist::parse("zipf:1.2").unwrap(), Dist::Zipf(1.2));
        assert_eq!(Dist::parse("hot").unwrap(), Dist::Hot);
        assert!(Dist::parse("zipf:-1").is_err());
        assert!(Dist::parse("gauss").is_err());
    }

    #[test]
    fn uniform_covers_and_stays_in_range() {
        let p = KeyPicker::new(Dist::Uniform, 10);
        let mut rng = Rng::new(7);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[p.pick(&mut rng, 0) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800 && n < 1200), "{seen:?}");
    }

    #[test]
    fn zipf_is_skewed_toward_rank_one() {
        let p = KeyPicker::new(Dist::Zipf(1.0), 1000);
        let mut rng = Rng::new(3);
        let mut first = 0;
        let n = 100_000;
        for _ in 0..n {
            let k = p.pick(&mut rng, 0);
            assert!(k < 1000);
            if k == 0 {
                first += 1;
            }
        }
        // H(1000) ~ 7.485, so rank 1 has ~13.4 % of the mass.
        let share = first as f64 / n as f64;
        assert!((0.12..0.15).contains(&share), "{share}");
    }

    #[test]
    fn hot_and_private() {
        let mut rng = Rng::new(1);
        assert_eq!(KeyPicker::new(Dist::Hot, 50).pick(&mut rng, 9), 0);
        assert_eq!(KeyPicker::new(Dist::Private, 50).pick(&mut rng, 9), 9);
        assert_eq!(KeyPicker::new(Dist::Private, 5).pick(&mut rng, 9), 4);
    }
}
