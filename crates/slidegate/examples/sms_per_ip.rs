//! Limiting SMS verification codes per client IP: at most 5 in any rolling minute, and a bulk
//! request counts every message it sends. A request that does not fit is refused whole and
//! charges nothing.
//!
//! ```text
//! cargo run --example sms_per_ip
//! ```

use slidegate::{Limiter, Quota};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), slidegate::Error> {
    let limiter = Limiter::in_memory();
    let sms = Quota::per_minute(5)?;
    let ip = "192.168.1.100";
    for (what, cost) in [("one code", 1), ("one code", 1), ("a batch of 3", 3), ("one more code", 1)] {
        let d = limiter.check_cost(ip, &sms, cost).await?;
        let verdict = if d.allowed {
            "sent".to_owned()
        } else {
            format!("refused, retry in {:?}", d.retry_after.unwrap_or_default())
        };
        println!("{ip} asks for {what}: {verdict}; {} of {} left this minute", d.remaining, d.limit);
    }
    // Another IP has its own budget.
    let d = limiter.check("10.0.0.7", &sms).await?;
    println!("10.0.0.7 asks for one code: {}", if d.allowed { "sent" } else { "refused" });
    Ok(())
}
