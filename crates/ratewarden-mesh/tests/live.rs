//! Members heard from: each round reaches one peer in turn beside those picked at random,
//! so every live member is heard from by every other within `n − 1` rounds, and the live
//! count of an idle mesh holds still.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::Timestamp;
use ratewarden_mesh::{Config, Mode, Node};

#[test]
fn every_member_is_heard_from_within_n_minus_one_rounds() {
    const INTERVAL: u64 = 100_000;
    for n in [4_u64, 16, 32] {
        let ids: Vec<u64> = (1..=n).collect();
        let mut mesh: Vec<Node> = ids
            .iter()
            .map(|&id| Node::new(id, &ids, Config::new(Mode::Escrow)))
            .collect();
        for r in 1..=300 {
            let now = r * INTERVAL;
            let out: Vec<_> = mesh
                .iter_mut()
                .flat_map(|node| node.tick(Timestamp::from_micros(now)))
                .collect();
            for datagram in out {
                let to = usize::try_from(datagram.to - 1).unwrap();
                mesh[to]
                    .receive(Timestamp::from_micros(now), &datagram.bytes)
                    .unwrap();
            }
            if r > 2 * n {
                let since = Timestamp::from_micros(now - (n - 1) * INTERVAL);
                for node in &mesh {
                    let live = node.live(since).len();
                    assert_eq!(
                        live,
                        ids.len(),
                        "round {r}: {} hears {live} of {n}",
                        node.id()
                    );
                }
            }
        }
    }
}
