//! `LIKE` patterns: compiled once for a literal pattern, matched per message in time
//! linear in the text for patterns without `_` between two `%`s.
//!
//! A pattern is a run of pieces separated by `%`; each piece has a fixed length (`_` is
//! one character). The first piece must match at the start of the text and the last at its
//! end; each piece between them is found leftmost after the one before (the leftmost
//! place leaves the most room for the rest, so the greedy choice is right and nothing is
//! ever tried twice). A piece of literal characters is found with Knuth–Morris–Pratt
//! (O(text + piece)); one with `_` in it by a bit-parallel shift-and (O(text × piece/64)).
//! Every step is charged to the evaluation's [`Budget`], so no pattern runs past it.

use std::collections::HashMap;

use super::*;

pub(super) fn compile_like(pattern: &str, escape: Option<char>) -> Result<Vec<LikeTok>, String> {
    let mut out = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if Some(c) == escape {
            match chars.next() {
                Some(n) if n == '%' || n == '_' || Some(n) == escape => out.push(LikeTok::Lit(n)),
                Some(n) => {
                    return Err(format!("invalid escape sequence `{c}{n}` in LIKE pattern"));
                }
                None => return Err("LIKE pattern ends with the escape character".into()),
            }
        } else {
            out.push(match c {
                '%' => LikeTok::Many,
                '_' => LikeTok::One,
                c => LikeTok::Lit(c),
            });
        }
    }
    Ok(out)
}

/// Steps charged at a time while scanning (the budget is checked this often).
const CHUNK: u64 = 1024;

/// Counts steps, charging the budget every [`CHUNK`] of them.
struct Meter<'b> {
    budget: &'b mut Budget,
    pending: u64,
}

impl Meter<'_> {
    fn step(&mut self, n: u64) -> Result<(), OverBudget> {
        self.pending += n;
        if self.pending >= CHUNK {
            let n = std::mem::take(&mut self.pending);
            self.budget.charge(n)?;
        }
        Ok(())
    }

    fn settle(self) -> Result<(), OverBudget> {
        self.budget.charge(self.pending)
    }
}

/// Whether `text` matches `pat` (SQL `LIKE`), every step charged to `budget`.
pub(super) fn like_match(text: &[char], pat: &[LikeTok], budget: &mut Budget) -> Result<bool, OverBudget> {
    budget.charge(pat.len() as u64 + 1)?;
    let pieces: Vec<&[LikeTok]> = pat.split(|t| *t == LikeTok::Many).collect();
    let mut meter = Meter { budget, pending: 0 };
    let matched = pieces_match(text, &pieces, &mut meter)?;
    meter.settle()?;
    Ok(matched)
}

fn pieces_match(text: &[char], pieces: &[&[LikeTok]], meter: &mut Meter<'_>) -> Result<bool, OverBudget> {
    let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else { return Ok(true) };
    if pieces.len() == 1 {
        return Ok(text.len() == first.len() && at(text, first, meter)?);
    }
    if text.len() < first.len() + last.len() {
        return Ok(false);
    }
    let (mut lo, hi) = (first.len(), text.len() - last.len());
    if !at(text, first, meter)? || !at(&text[hi..], last, meter)? {
        return Ok(false);
    }
    for piece in &pieces[1..pieces.len() - 1] {
        if piece.is_empty() {
            continue;
        }
        match find(&text[lo..hi], piece, meter)? {
            Some(i) => lo += i + piece.len(),
            None => return Ok(false),
        }
    }
    Ok(true)
}

/// Whether `piece` matches at the start of `text` (which is at least as long).
fn at(text: &[char], piece: &[LikeTok], meter: &mut Meter<'_>) -> Result<bool, OverBudget> {
    meter.step(piece.len() as u64)?;
    Ok(piece.iter().zip(text).all(|(p, c)| match p {
        LikeTok::Lit(l) => l == c,
        _ => true,
    }))
}

/// Where `piece` (no `%`) first matches in `hay`.
fn find(hay: &[char], piece: &[LikeTok], meter: &mut Meter<'_>) -> Result<Option<usize>, OverBudget> {
    if piece.len() > hay.len() {
        return Ok(None);
    }
    if piece.iter().all(|t| *t == LikeTok::One) {
        return Ok(Some(0));
    }
    let lits: Option<Vec<char>> = piece
        .iter()
        .map(|t| match t {
            LikeTok::Lit(c) => Some(*c),
            _ => None,
        })
        .collect();
    match lits {
        Some(needle) => kmp(hay, &needle, meter),
        None => shift_and(hay, piece, meter),
    }
}

/// Knuth–Morris–Pratt: the first occurrence of `needle` in `hay`, in O(hay + needle).
fn kmp(hay: &[char], needle: &[char], meter: &mut Meter<'_>) -> Result<Option<usize>, OverBudget> {
    let m = needle.len();
    let mut fail = vec![0usize; m];
    let mut k = 0;
    for i in 1..m {
        while k > 0 && needle[i] != needle[k] {
            k = fail[k - 1];
            meter.step(1)?;
        }
        if needle[i] == needle[k] {
            k += 1;
        }
        fail[i] = k;
        meter.step(1)?;
    }
    let mut k = 0;
    for (i, c) in hay.iter().enumerate() {
        while k > 0 && *c != needle[k] {
            k = fail[k - 1];
            meter.step(1)?;
        }
        if *c == needle[k] {
            k += 1;
        }
        meter.step(1)?;
        if k == m {
            return Ok(Some(i + 1 - m));
        }
    }
    Ok(None)
}

/// Shift-and over `⌈piece/64⌉` words: the first place `piece` (literals and `_`) matches.
fn shift_and(hay: &[char], piece: &[LikeTok], meter: &mut Meter<'_>) -> Result<Option<usize>, OverBudget> {
    let m = piece.len();
    let words = m.div_ceil(64);
    // A mask per distinct literal, and one for every other character (`_` positions).
    let mut any = vec![0u64; words];
    let mut masks: HashMap<char, Vec<u64>> = HashMap::new();
    for t in piece {
        if let LikeTok::Lit(c) = t
            && !masks.contains_key(c)
        {
            meter.step(words as u64)?;
            masks.insert(*c, vec![0u64; words]);
        }
        meter.step(1)?;
    }
    for (i, t) in piece.iter().enumerate() {
        let bit = 1u64 << (i % 64);
        match t {
            LikeTok::Lit(c) => {
                if let Some(mask) = masks.get_mut(c) {
                    mask[i / 64] |= bit;
                }
            }
            _ => {
                any[i / 64] |= bit;
                for mask in masks.values_mut() {
                    mask[i / 64] |= bit;
                }
                meter.step(masks.len() as u64)?;
            }
        }
    }
    let top = (m - 1) % 64;
    let mut state = vec![0u64; words];
    for (pos, c) in hay.iter().enumerate() {
        meter.step(words as u64)?;
        let mask = masks.get(c).unwrap_or(&any);
        let mut carry = 1u64;
        for (s, mk) in state.iter_mut().zip(mask) {
            let next_carry = *s >> 63;
            *s = ((*s << 1) | carry) & mk;
            carry = next_carry;
        }
        if state[words - 1] >> top & 1 == 1 {
            return Ok(Some(pos + 1 - m));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, pattern: &str, steps: u64) -> (Result<bool, OverBudget>, u64) {
        let toks = compile_like(pattern, Some('\\')).expect("pattern");
        let chars: Vec<char> = text.chars().collect();
        let mut b = Budget::new(steps, usize::MAX);
        let r = like_match(&chars, &toks, &mut b);
        (r, b.used())
    }

    fn like(text: &str, pattern: &str) -> bool {
        run(text, pattern, u64::MAX).0.expect("within budget")
    }

    /// The backtracking matcher, as the reference on small inputs.
    fn reference(t: &[char], p: &[LikeTok]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((LikeTok::Many, rest)) => (0..=t.len()).any(|i| reference(&t[i..], rest)),
            Some((LikeTok::One, rest)) => !t.is_empty() && reference(&t[1..], rest),
            Some((LikeTok::Lit(c), rest)) => t.first() == Some(c) && reference(&t[1..], rest),
        }
    }

    #[test]
    fn matches_as_sql_like_does() {
        let cases = [
            ("", "", true),
            ("", "%", true),
            ("", "_", false),
            ("abc", "abc", true),
            ("abc", "ab", false),
            ("abc", "a%", true),
            ("abc", "%c", true),
            ("abc", "%b%", true),
            ("abc", "%d%", false),
            ("abc", "a_c", true),
            ("ab", "a_c", false),
            ("mississippi", "%iss%ppi", true),
            ("mississippi", "m%s_s%i", true),
            ("mississippi", "%issip%issip%", false),
            ("aaa", "%aa%aa%", false),
            ("aaaa", "%aa%aa%", true),
            ("abab", "ab%ab", true),
            ("aba", "ab%ba", false),
            ("x100% pure", "%100\\%%", true),
            ("日本語テキスト", "日_語%ト", true),
            ("abcabd", "%a_d", true),
            ("abcabc", "%a_d", false),
        ];
        for (t, p, want) in cases {
            assert_eq!(like(t, p), want, "{t:?} LIKE {p:?}");
        }
    }

    #[test]
    fn agrees_with_backtracking_on_every_small_case() {
        let alphabet = ['a', 'b'];
        let toks = [LikeTok::Lit('a'), LikeTok::Lit('b'), LikeTok::One, LikeTok::Many];
        let mut texts = vec![String::new()];
        for len in 1..=5 {
            for n in 0..(1usize << len) {
                texts.push((0..len).map(|i| alphabet[(n >> i) & 1]).collect());
            }
        }
        let mut patterns = vec![Vec::new()];
        for len in 1..=4u32 {
            for n in 0..4usize.pow(len) {
                patterns.push((0..len).map(|i| toks[(n / 4usize.pow(i)) % 4]).collect::<Vec<_>>());
            }
        }
        for t in &texts {
            let chars: Vec<char> = t.chars().collect();
            for p in &patterns {
                let mut b = Budget::new(u64::MAX, usize::MAX);
                assert_eq!(like_match(&chars, p, &mut b), Ok(reference(&chars, p)), "{t:?} {p:?}");
            }
        }
    }

    /// The patterns that made the backtracking matcher quadratic cost a few steps per
    /// character now: counted, not timed.
    #[test]
    fn adversarial_patterns_are_linear() {
        let n = 200_000;
        let text = "0".repeat(n);
        // '%000…0001' (3,923 characters): the old matcher compared ~n × 3,922 times.
        let p = format!("%{}1", "0".repeat(3921));
        let (r, used) = run(&text, &p, u64::MAX);
        assert_eq!(r, Ok(false));
        assert!(used < 3 * n as u64 + 10_000, "{used}");
        // '%' || the text itself || '1': one piece as long as the text.
        let p = format!("%{text}1");
        let (r, used) = run(&text, &p, u64::MAX);
        assert_eq!(r, Ok(false));
        assert!(used < 3 * n as u64 + 10, "{used}");
        // Many pieces: '%0%0%0…%1'.
        let p = format!("{}%1", "%0".repeat(1000));
        let (r, used) = run(&text, &p, u64::MAX);
        assert_eq!(r, Ok(false));
        assert!(used < 8 * n as u64, "{used}");
        // KMP's worst case: 'aaa…ab' in 'aaa…a'.
        let text = "a".repeat(n);
        let p = format!("%{}b%", "a".repeat(3000));
        let (r, used) = run(&text, &p, u64::MAX);
        assert_eq!(r, Ok(false));
        assert!(used < 3 * n as u64 + 10_000, "{used}");
    }

    /// A piece with `_` costs a word per 64 characters of it per character of text, and is
    /// stopped by the budget, not run to its end.
    #[test]
    fn wildcard_pieces_are_bit_parallel_and_bounded() {
        let n = 100_000;
        let text = "0".repeat(n);
        let p = format!("%{}_1%", "0".repeat(126)); // 128 characters: two words
        let (r, used) = run(&text, &p, u64::MAX);
        assert_eq!(r, Ok(false));
        assert!(used < 2 * n as u64 + 2_000, "{used}");
        let p = format!("%{}_1%", "0".repeat(3998));
        let (r, used) = run(&text, &p, 1_000_000);
        assert_eq!(r, Err(OverBudget::Steps));
        assert!(used <= 1_000_000 + CHUNK + 64, "stopped near the budget: {used}");
        let text = format!("{}x{}", "ab".repeat(50), "y".repeat(70));
        assert!(like(&text, &format!("%b_{}%", "y".repeat(69))));
        assert!(!like(&text, &format!("%b_{}%", "y".repeat(71))));
    }
}
