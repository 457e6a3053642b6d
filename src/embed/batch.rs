//! Forming model batches by a token budget: sequences sorted by length so little padding is
//! computed, each batch's padded size (count x longest) within the budget.

/// Indices of `lengths` grouped into batches, shortest first. A sequence longer than the
/// budget gets a batch of its own.
pub fn plan(lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for i in order {
        // Sorted ascending: the newcomer is the batch's longest.
        if !current.is_empty() && (current.len() + 1) * lengths[i].max(1) > budget {
            batches.push(std::mem::take(&mut current));
        }
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// For encoders that compute no padding: batches whose real tokens stay within `budget`,
/// sequences sorted by length (similar lengths still balance the per-sequence attention).
pub fn plan_unpadded(lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut sum = 0;
    for i in order {
        if !current.is_empty() && sum + lengths[i] > budget {
            batches.push(std::mem::take(&mut current));
            sum = 0;
        }
        sum += lengths[i];
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Padded tokens a batch computes.
pub fn padded(lengths: &[usize], batch: &[usize]) -> usize {
    batch.iter().map(|&i| lengths[i]).max().unwrap_or(0) * batch.len()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn batches_respect_the_budget_and_take_everything(
            lengths in prop::collection::vec(1usize..300, 0..200),
            budget in 1usize..4096,
        ) {
            let batches = plan(&lengths, budget);
            let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
            for b in &batches {
                prop_assert!(!b.is_empty());
                prop_assert!(padded(&lengths, b) <= budget || b.len() == 1);
            }
        }
    }

    #[test]
    fn sorting_cuts_padding() {
        let lengths = [10, 200, 12, 190, 11, 205];
        let batches = plan(&lengths, 420);
        let total: usize = batches.iter().map(|b| padded(&lengths, b)).sum();
        assert_eq!(batches, vec![vec![0, 4, 2], vec![3, 1], vec![5]]);
        assert_eq!(total, 3 * 12 + 2 * 200 + 205);
    }
}
