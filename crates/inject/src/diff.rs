//! `--dry-run`: what `inject` would change, as a unified diff of each document changed
//! (written before and after in the same style, so only what changed shows).

/// Lines of context around a change.
const CONTEXT: usize = 3;
/// Past this many cells the table of the longest common subsequence is not built and
/// the document shows as replaced whole (manifests are far smaller).
const MAX_CELLS: usize = 16_000_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Same,
    Gone,
    New,
}

/// The unified diff of `before` and `after` under the headers given; empty when equal.
pub fn unified(before: &str, after: &str, from: &str, to: &str) -> String {
    if before == after {
        return String::new();
    }
    let a: Vec<&str> = before.lines().collect();
    let b: Vec<&str> = after.lines().collect();
    let ops = script(&a, &b);
    let mut out = format!("--- {from}\n+++ {to}\n");
    // Walk the script, cutting it into hunks with CONTEXT lines of context.
    let changed: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].0 != Op::Same).collect();
    let mut i = 0;
    while i < changed.len() {
        let start = changed[i].saturating_sub(CONTEXT);
        let mut end = changed[i];
        while i < changed.len() && changed[i] <= end + 2 * CONTEXT {
            end = changed[i];
            i += 1;
        }
        let end = (end + CONTEXT + 1).min(ops.len());
        let hunk = &ops[start..end];
        let (a0, b0) = (ops[start].1, ops[start].2);
        let a_len = hunk.iter().filter(|o| o.0 != Op::New).count();
        let b_len = hunk.iter().filter(|o| o.0 != Op::Gone).count();
        out.push_str(&format!(
            "@@ -{},{a_len} +{},{b_len} @@\n",
            a0 + usize::from(a_len > 0),
            b0 + usize::from(b_len > 0)
        ));
        for &(op, ai, bi) in hunk {
            match op {
                Op::Same => out.push_str(&format!(" {}\n", a[ai])),
                Op::Gone => out.push_str(&format!("-{}\n", a[ai])),
                Op::New => out.push_str(&format!("+{}\n", b[bi])),
            }
        }
    }
    out
}

/// The edit script: each step with the line numbers (0-based) it stands at in each text.
fn script(a: &[&str], b: &[&str]) -> Vec<(Op, usize, usize)> {
    let (n, m) = (a.len(), b.len());
    let mut ops = Vec::with_capacity(n + m);
    if (n + 1).saturating_mul(m + 1) > MAX_CELLS {
        ops.extend((0..n).map(|i| (Op::Gone, i, 0)));
        ops.extend((0..m).map(|j| (Op::New, n, j)));
        return ops;
    }
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let w = m + 1;
    let mut lcs = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * w + j] = if a[i] == b[j] {
                lcs[(i + 1) * w + j + 1] + 1
            } else {
                lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((Op::Same, i, j));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
            ops.push((Op::Gone, i, j));
            i += 1;
        } else {
            ops.push((Op::New, i, j));
            j += 1;
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::unified;

    #[test]
    fn a_change_shows_with_its_context() {
        let before = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let after = "a\nb\nc\nd\nX\nf\ng\nh\ni\n";
        assert_eq!(
            unified(before, after, "x", "y"),
            "--- x\n+++ y\n@@ -2,7 +2,8 @@\n b\n c\n d\n-e\n+X\n f\n g\n h\n+i\n"
        );
        assert_eq!(unified(before, before, "x", "y"), "");
        assert_eq!(
            unified("", "a\n", "x", "y"),
            "--- x\n+++ y\n@@ -0,0 +1,1 @@\n+a\n"
        );
    }
}
