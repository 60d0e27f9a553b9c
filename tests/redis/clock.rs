//! A Redis whose wall clock steps (an NTP correction, a VM resumed): the scripts decide by
//! Redis's `TIME`, so a step is time passing (forward) or a state from the future (back).
//! Each test runs twin servers, one stepped, under the same checks, and bounds the
//! difference.

use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota, Store};
use ratewarden_redis::RedisConfig;
use tests::redis_server::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_clock_stepped_an_hour_forward_then_back_stays_within_the_stated_bounds() {
    let steady = RedisServer::start();
    let stepped = RedisServer::start_with_shifted_clock();
    let store = |server: &RedisServer| {
        RedisConfig::new(server.url())
            .prefix("clock")
            .deny_cache(0)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let (a, b) = (store(&steady), store(&stepped));
    // 10/s, burst 10 (a horizon of 1 s), asked every 10 ms: the rate binds.
    let quota = Quota::per_second(10).unwrap().with_burst(10).unwrap();
    let key = Key::from("clock");
    let (mut admitted_a, mut admitted_b) = ([0_u32; 3], [0_u32; 3]);
    let start = Instant::now();
    let mut phase = 0;
    while start.elapsed() < Duration::from_secs(3) {
        let now = start.elapsed().as_millis() / 1_000;
        if now > phase {
            phase = now;
            // An hour forward at 1 s, and back at 2 s.
            stepped.shift_clock(if phase == 1 { 3_600 } else { 0 });
        }
        let p = (phase as usize).min(2);
        admitted_a[p] += u32::from(a.check(&key, &quota, 1).await.unwrap().is_allowed());
        admitted_b[p] += u32::from(b.check(&key, &quota, 1).await.unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("admitted per second, steady {admitted_a:?}, stepped {admitted_b:?}");
    // Before any step, the twins agree.
    assert!(admitted_a[0].abs_diff(admitted_b[0]) <= 1);
    // Forward: the state looks an hour old, as if that time had passed: at most one burst
    // more than the twin.
    assert!(
        admitted_b[1] <= admitted_a[1] + 10 + 1,
        "{admitted_b:?} against {admitted_a:?}"
    );
    // Back an hour: the state is from the future, taken as fully spent now, no more: denied
    // for at most the horizon (1 s), a second's rate fewer than the twin, never for an hour.
    assert!(
        admitted_b[2] + 10 + 2 >= admitted_a[2],
        "{admitted_b:?} against {admitted_a:?}"
    );
    assert!(
        admitted_b[2] <= admitted_a[2] + 1,
        "{admitted_b:?} against {admitted_a:?}"
    );
}
