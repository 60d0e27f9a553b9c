//! A gateway that holds reservations and never settles them, for the test that kills it:
//! reserves `COUNT` units of `KEY` (one each, under `QUOTA`, held for `HOLD_MS`) on the Redis
//! at `REDIS_URL` under `PREFIX`, prints `held N`, then waits to be killed (at most a minute).
#![allow(clippy::unwrap_used)] // a test fixture: a failed unwrap fails the test that runs it

use std::time::Duration;

use ratewarden_core::{Key, Limit, Quota, Store};
use ratewarden_redis::RedisConfig;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let var = |name: &str| std::env::var(name).unwrap();
    let store = RedisConfig::new(var("REDIS_URL"))
        .prefix(var("PREFIX"))
        .connect()
        .await
        .unwrap();
    let quota: Quota = var("QUOTA").parse().unwrap();
    let hold = Duration::from_millis(var("HOLD_MS").parse().unwrap());
    let limit = Limit::new(Key::from(var("KEY").as_str()), quota, 1);
    let mut held = Vec::new();
    for _ in 0..var("COUNT").parse::<u32>().unwrap() {
        let reservation = store
            .reserve(std::slice::from_ref(&limit), hold)
            .await
            .unwrap();
        assert!(reservation.is_allowed());
        held.push(reservation);
    }
    println!("held {}", held.len());
    tokio::time::sleep(Duration::from_secs(60)).await;
}
