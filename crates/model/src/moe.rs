//! Mixture-of-experts routing: which token rows go to which expert, with what weight.

/// For each expert, the token rows routed to it and their gate weights: softmax over the
/// router logits, the top `used` experts per token, optionally renormalised.
pub(crate) fn route_tokens(
    logits: &[f32],
    tokens: usize,
    n_expert: usize,
    used: usize,
    renormalise: bool,
) -> Vec<(Vec<u32>, Vec<f32>)> {
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

#[cfg(test)]
mod tests {
    use super::route_tokens;

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
}
