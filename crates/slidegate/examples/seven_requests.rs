//! A limit of 5 requests per 10 seconds, seven requests half a second apart.
//! Requests 1–5 are admitted, 6 and 7 answered 429 with the time to wait.
//!
//! ```text
//! cargo run --example seven_requests --features redis                           # embedded
//! cargo run --example seven_requests --features redis -- --redis redis://127.0.0.1:6379
//! ```

use std::time::Duration;

use slidegate::{Backend, Limiter, MemoryBackend, Quota, RedisBackend};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let redis_url = match args.as_slice() {
        [] => None,
        [flag, url] if flag == "--redis" => Some(url.clone()),
        _ => return Err("usage: seven_requests [--redis redis://host:port]".into()),
    };
    // A fresh key per run, so running the demo twice in ten seconds shows the same thing.
    let key = format!("user_1001:{}", std::process::id());
    let quota = Quota::new(5, Duration::from_secs(10))?;
    match redis_url {
        Some(url) => {
            println!("backend: redis at {url}");
            replay(&Limiter::new(RedisBackend::connect(&url).await?), &key, &quota).await
        }
        None => {
            println!("backend: embedded memory");
            replay(&Limiter::new(MemoryBackend::new()), &key, &quota).await
        }
    }
}

async fn replay<B: Backend>(limiter: &Limiter<B>, key: &str, quota: &Quota) -> Result<(), Box<dyn std::error::Error>> {
    println!("limit: {} per {:?}, seven requests 0.5 s apart", quota.limit(), quota.window());
    for i in 1..=7 {
        let d = limiter.check(key, quota).await?;
        match d.retry_after {
            None => println!("request {i}: admitted   (remaining {})", d.remaining),
            Some(wait) => println!("request {i}: 429        (retry after {:.1} s)", wait.as_secs_f64()),
        }
        if i < 7 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}
