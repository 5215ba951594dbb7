//! `serve` playing a distant cluster: blob data in each direction shares one link of a set
//! bandwidth (`--throttle-bandwidth`), so that what compression and deduplication save on a WAN
//! can be measured on one machine. (`--throttle-latency-ms` is a delay at the start of every call,
//! applied with the fault-injection delay.)

use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// A bandwidth in bits per second: `50Mbit`, `1.5Gbit`, `800kbit`, `2000000` (bits).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth(f64);

impl FromStr for Bandwidth {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.trim().to_ascii_lowercase();
        let number = lower.strip_suffix("bit").unwrap_or(&lower);
        let (number, scale) = match number.char_indices().last() {
            Some((i, 'k')) => (&number[..i], 1e3),
            Some((i, 'm')) => (&number[..i], 1e6),
            Some((i, 'g')) => (&number[..i], 1e9),
            _ => (number, 1.0),
        };
        match number.trim().parse::<f64>() {
            Ok(n) if n.is_finite() && n > 0.0 => Ok(Bandwidth(n * scale)),
            _ => Err(format!(
                "expected a bandwidth such as 50Mbit, 800kbit or 1Gbit, got {s:?}"
            )),
        }
    }
}

/// The two directions of the emulated link; unlimited without `--throttle-bandwidth`.
#[derive(Debug)]
pub struct Throttle {
    bytes_per_sec: Option<f64>,
    /// When the link towards the server, and away from it, is free again.
    inbound: Mutex<Option<Instant>>,
    outbound: Mutex<Option<Instant>>,
}

impl Throttle {
    pub fn new(bandwidth: Option<Bandwidth>) -> Self {
        Self {
            bytes_per_sec: bandwidth.map(|Bandwidth(bits)| bits / 8.0),
            inbound: Mutex::new(None),
            outbound: Mutex::new(None),
        }
    }

    /// Waits until `bytes` received from a client have crossed the link.
    pub async fn receive(&self, bytes: usize) {
        self.pace(&self.inbound, bytes).await;
    }

    /// Waits until `bytes` sent to a client have crossed the link.
    pub async fn send(&self, bytes: usize) {
        self.pace(&self.outbound, bytes).await;
    }

    async fn pace(&self, link: &Mutex<Option<Instant>>, bytes: usize) {
        let Some(rate) = self.bytes_per_sec else {
            return;
        };
        let done = {
            let Ok(mut free) = link.lock() else { return };
            let now = Instant::now();
            let start = free.map_or(now, |free| free.max(now));
            let done = start + Duration::from_secs_f64(bytes as f64 / rate);
            *free = Some(done);
            done
        };
        tokio::time::sleep_until(done).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bandwidths() {
        assert_eq!("50Mbit".parse(), Ok(Bandwidth(50e6)));
        assert_eq!("1.5gbit".parse(), Ok(Bandwidth(1.5e9)));
        assert_eq!("800k".parse(), Ok(Bandwidth(800e3)));
        assert_eq!("2000".parse(), Ok(Bandwidth(2000.0)));
        for bad in ["", "fast", "0Mbit", "-5Mbit", "Mbit"] {
            assert!(bad.parse::<Bandwidth>().is_err(), "{bad}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn transfers_share_the_link() {
        let throttle = Throttle::new(Some(Bandwidth(8e6))); // 1 MB/s
        let start = Instant::now();
        tokio::join!(throttle.receive(500_000), throttle.receive(500_000));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        // The other direction is a link of its own.
        let start = Instant::now();
        throttle.send(250_000).await;
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        let unlimited = Throttle::new(None);
        let start = Instant::now();
        unlimited.receive(1 << 30).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
