//! Latency histograms (HDR, microseconds, 3 significant digits) and their percentiles.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Microseconds, from 1 µs to one hour.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Records `seconds` (clamped into the histogram's range; a negative value from clock skew
/// counts as 1 µs).
pub fn record(histogram: &mut Histogram<u64>, seconds: f64) {
    let micros = (seconds * 1e6).round().clamp(1.0, 3_600_000_000.0) as u64;
    histogram.saturating_record(micros);
}

/// The percentiles a report shows, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Self {
        if histogram.is_empty() {
            return Self::default();
        }
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        Self {
            count: histogram.len(),
            p50_ms: ms(0.5),
            p90_ms: ms(0.9),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: histogram.max() as f64 / 1000.0,
            mean_ms: histogram.mean() / 1000.0,
        }
    }

    /// `p50 … max` on one line.
    pub fn line(&self) -> String {
        if self.count == 0 {
            return "no samples".to_owned();
        }
        format!(
            "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (n={})",
            ms(self.p50_ms),
            ms(self.p90_ms),
            ms(self.p99_ms),
            ms(self.p999_ms),
            ms(self.max_ms),
            self.count
        )
    }
}

/// A duration in milliseconds, with precision that suits its size.
pub fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}ms")
    } else if value >= 10.0 {
        format!("{value:.1}ms")
    } else {
        format!("{value:.2}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_spread() {
        let mut h = histogram();
        for i in 1..=1000 {
            record(&mut h, i as f64 / 1000.0);
        }
        let p = Percentiles::of(&h);
        assert_eq!(p.count, 1000);
        assert!((p.p50_ms - 500.0).abs() < 1.0, "{p:?}");
        assert!((p.p99_ms - 990.0).abs() < 1.0, "{p:?}");
        assert!((p.max_ms - 1000.0).abs() < 1.0, "{p:?}");
        record(&mut h, -1.0);
        assert_eq!(h.min(), 1);
    }
}
