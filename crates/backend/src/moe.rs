//! Mixture-of-experts routing: which token rows go to which expert, with what weight.
//!
//! [`route_tokens`] is the host routing of [`crate::FusedOps::moe_ffn`]'s default; a device
//! backend that routes on the device hands its `[tokens, used]` table of expert ids and
//! weights to [`group_by_expert`] to get the same per-expert lists.

/// For each expert, the token rows routed to it (ascending) and their gate weights.
pub type Routes = Vec<(Vec<u32>, Vec<f32>)>;

/// For each expert, the token rows routed to it and their gate weights: softmax over the
/// router logits (`[tokens, n_expert]`), the top `used` experts per token (equal
/// probabilities: the lower expert index first), optionally renormalised.
pub fn route_tokens(
    logits: &[f32],
    tokens: usize,
    n_expert: usize,
    used: usize,
    renormalise: bool,
) -> Routes {
    let mut routes = vec![(Vec::new(), Vec::new()); n_expert];
    let mut probs = vec![0.0f32; n_expert];
    let mut order: Vec<usize> = (0..n_expert).collect();
    for t in 0..tokens {
        let row = &logits[t * n_expert..(t + 1) * n_expert];
        // As ggml's `soft_max` (fewer than 16 experts: its scalar loop): the exponentials
        // summed in f64, then each scaled by the f32 reciprocal of the sum.
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f64;
        for (p, &l) in probs.iter_mut().zip(row) {
            *p = (l - max).exp();
            sum += f64::from(*p);
        }
        let inverse = (1.0 / sum) as f32;
        for p in probs.iter_mut() {
            *p *= inverse;
        }
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..used];
        // ggml's `sum_rows` accumulates in f64.
        let total = chosen.iter().map(|&e| f64::from(probs[e])).sum::<f64>() as f32;
        for &e in chosen {
            let weight = if renormalise {
                probs[e] / total
            } else {
                probs[e]
            };
            routes[e].0.push(t as u32);
            routes[e].1.push(weight);
        }
    }
    routes
}

/// The per-expert lists of a routing table: `ids` and `weights` are `[tokens, used]` (token
/// `t`'s experts and their gate weights). Ids at or past `n_expert` are skipped.
pub fn group_by_expert(ids: &[u32], weights: &[f32], used: usize, n_expert: usize) -> Routes {
    let mut routes = vec![(Vec::new(), Vec::new()); n_expert];
    for (t, (token_ids, token_weights)) in ids
        .chunks(used.max(1))
        .zip(weights.chunks(used.max(1)))
        .enumerate()
    {
        for (&e, &w) in token_ids.iter().zip(token_weights) {
            if let Some((rows, scales)) = routes.get_mut(e as usize) {
                rows.push(t as u32);
                scales.push(w);
            }
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::{group_by_expert, route_tokens};

    #[test]
    fn routing_picks_the_top_experts_by_softmax() {
        // One token, logits favour experts 2 then 0.
        let logits = [1.0, -1.0, 2.0, 0.0];
        let routes = route_tokens(&logits, 1, 4, 2, false);
        let z: f32 = logits.iter().map(|l| (l - 2.0f32).exp()).sum();
        assert_eq!(routes[2].0, vec![0]);
        assert!((routes[2].1[0] - 1.0 / z).abs() < 1e-6);
        assert_eq!(routes[0].0, vec![0]);
        assert!(routes[1].0.is_empty() && routes[3].0.is_empty());
        let renorm = route_tokens(&logits, 1, 4, 2, true);
        assert!((renorm[2].1[0] + renorm[0].1[0] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn equal_logits_go_to_the_lower_expert_index() {
        // Token 0: experts 1, 2 and 3 tie for the top; token 1: every expert ties; token 2:
        // expert 3 leads, 0 and 2 tie for the second place.
        let logits = [
            0.5, 2.0, 2.0, 2.0, //
            0.0, 0.0, 0.0, 0.0, //
            1.0, -3.0, 1.0, 4.0,
        ];
        let routes = route_tokens(&logits, 3, 4, 2, true);
        let rows: Vec<Vec<u32>> = routes.iter().map(|(rows, _)| rows.clone()).collect();
        assert_eq!(rows, [vec![1, 2], vec![0, 1], vec![0], vec![2]]);
        // Renormalised equal probabilities are one half each.
        assert_eq!(routes[1].1, [0.5, 0.5]);
        assert_eq!(routes[0].1[0], 0.5);
        let e = (1.0f32 - 4.0).exp();
        let expected_lead = 1.0 / (1.0 + e);
        assert!(
            (routes[3].1[0] - expected_lead).abs() < 1e-6,
            "{:?}",
            routes[3]
        );
    }

    #[test]
    fn a_routing_table_groups_into_the_same_routes() {
        let logits = [
            0.3, -1.0, 2.5, 0.1, 0.9, //
            -0.2, 1.7, 1.7, 0.0, -4.0, //
            3.0, 2.0, 1.0, 0.0, -1.0,
        ];
        let (tokens, experts, used) = (3, 5, 2);
        let routes = route_tokens(&logits, tokens, experts, used, false);
        // The same routing as a [tokens, used] table, each token's experts in any order.
        let mut ids = vec![0u32; tokens * used];
        let mut weights = vec![0.0f32; tokens * used];
        let mut next = vec![0usize; tokens];
        for (e, (rows, scales)) in routes.iter().enumerate() {
            for (&t, &w) in rows.iter().zip(scales) {
                let slot = t as usize * used + next[t as usize];
                next[t as usize] += 1;
                ids[slot] = e as u32;
                weights[slot] = w;
            }
        }
        assert_eq!(group_by_expert(&ids, &weights, used, experts), routes);
    }
}
