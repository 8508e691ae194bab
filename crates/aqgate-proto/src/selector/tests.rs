//! Tests of the condition language: parsing, refusals, evaluation, and properties.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;

const KNOWN: &[&str] = &[
    "priority",
    "corrid",
    "msgid",
    "enq_time",
    "state",
    "delay",
    "expiration",
    "retry_count",
    "sender_name",
    "sender_address",
    "sender_protocol",
    "exception_queue",
    "consumer_name",
    "q_name",
];

#[derive(Default)]
struct Ctx {
    props: HashMap<String, Value>,
    data: HashMap<String, Value>,
    user: HashMap<String, Value>,
}

impl Ctx {
    fn prop(mut self, k: &str, v: Value) -> Self {
        self.props.insert(k.into(), v);
        self
    }
    fn data(mut self, path: &str, v: Value) -> Self {
        self.data.insert(path.into(), v);
        self
    }
    fn user(mut self, k: &str, v: Value) -> Self {
        self.user.insert(k.into(), v);
        self
    }
}

impl ConditionContext for Ctx {
    fn property(&self, name: &str) -> Option<Value> {
        if KNOWN.contains(&name) { Some(self.props.get(name).cloned().unwrap_or(Value::Null)) } else { None }
    }
    fn user_data(&self, path: &[String]) -> Value {
        self.data.get(&path.join(".")).cloned().unwrap_or(Value::Null)
    }
    fn user_property(&self, name: &str) -> Value {
        if let Some(v) = self.user.get(name) {
            return v.clone();
        }
        self.user.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map_or(Value::Null, |(_, v)| v.clone())
    }
}

fn t(s: &str) -> Value {
    Value::Text(s.into())
}
fn n(x: f64) -> Value {
    Value::Number(x)
}

fn std_ctx() -> Ctx {
    Ctx::default()
        .prop("priority", n(3.0))
        .prop("corrid", t("ORD-1001"))
        .prop("msgid", t("4AF3"))
        .prop("state", n(0.0))
        .prop("retry_count", n(2.0))
        .prop("sender_name", t("app1"))
        .prop("q_name", t("NEW_ORDERS_QUE"))
        .prop("enq_time", t("2024-05-01T10:00:00Z"))
        // delay, expiration: known but null
        .data("deptno", t("60"))
        .data("sal", n(1500.5))
        .data("ename", t("  Smith  "))
        .data("orderregion", t("INTERNATIONAL"))
        .data("customer.country", t("USA"))
        .data("customer.address.city", t("Boston"))
        .data("note", t("100% pure_cotton"))
        .data("empty", t(""))
        .data("notnum", t("6O"))
        .data("flag", Value::Bool(true))
        .user("Country", t("USA"))
        .user("Rank", n(7.0))
        .user("vip", Value::Bool(true))
        .user("VipText", t("TRUE"))
        .user("priority", n(99.0)) // shadowed by the message property
}

fn check(cond: &str, ctx: &dyn ConditionContext) -> bool {
    match Condition::parse(cond) {
        Ok(c) => c.eval(ctx),
        Err(e) => panic!("{cond:?} failed to parse: {e}"),
    }
}

#[test]
fn table_driven_against_standard_context() {
    let ctx = std_ctx();
    let cases: &[(&str, bool)] = &[
        // reference examples
        ("tab.user_data.deptno=60", true),
        ("tab.user_data.deptno = 61", false),
        ("tab.user_data.orderregion = 'INTERNATIONAL'", true),
        ("TAB.USER_DATA.ORDERREGION = 'INTERNATIONAL'", true),
        ("priority < 5 AND corrid LIKE 'ORD%'", true),
        ("priority < 3 AND corrid LIKE 'ORD%'", false),
        ("tab.user_data.customer.country = 'USA'", true),
        ("tab.user_data.customer.address.city = 'Boston'", true),
        ("tab.user_data.customer.address.zip IS NULL", true),
        ("Country = 'USA'", true),
        ("country = 'USA'", true), // case-insensitive fallback of the context
        ("\"Country\" = 'USA'", true),
        ("\"Country\" = 'usa'", false),
        // property names, aliases, tab.<column>
        ("correlation = 'ORD-1001'", true),
        ("CORRID = 'ORD-1001'", true),
        ("tab.corrid = 'ORD-1001'", true),
        ("tab.priority = 3", true),
        ("msg_state = 0", true),
        ("delivery_count = 2", true),
        ("retry_count >= 2", true),
        ("sender_name = 'app1' AND q_name = 'NEW_ORDERS_QUE'", true),
        ("enq_time > '2024-01-01' AND enq_time < '2025-01-01'", true),
        ("priority = 3", true),      // message property wins over user property
        ("\"priority\" = 99", true), // quoted: always the JMS property
        ("Rank > 5", true),
        ("nosuch IS NULL", true),
        ("delay IS NULL AND expiration IS NULL", true),
        ("delay IS NOT NULL", false),
        // comparisons
        ("priority = 3", true),
        ("priority <> 3", false),
        ("priority != 4", true),
        ("priority < 3", false),
        ("priority <= 3", true),
        ("priority > 2", true),
        ("priority >= 4", false),
        ("'abc' < 'abd'", true),
        ("'B' > 'A'", true),
        ("'a' = 'A'", false),
        ("tab.user_data.deptno = '60'", true),
        ("tab.user_data.deptno > 9", true), // numeric, not text order
        ("tab.user_data.deptno = 60.0", true),
        ("tab.user_data.sal = 1500.5", true),
        ("tab.user_data.sal = '1500.5'", true),
        ("tab.user_data.sal > '2e2'", true),
        ("tab.user_data.notnum = 60", false),
        ("NOT (tab.user_data.notnum = 60)", false), // unknown, not false
        ("tab.user_data.flag = TRUE", true),
        ("vip = TRUE AND vip <> FALSE", true),
        ("VipText = TRUE", true),
        ("vip > FALSE", false), // booleans: only = and <>
        ("TRUE", true),
        ("FALSE", false),
        ("vip", true),
        ("NOT vip", false),
        // AND / OR / NOT / parens
        ("priority = 3 AND corrid = 'ORD-1001'", true),
        ("priority = 3 AND corrid = 'x'", false),
        ("priority = 4 OR corrid = 'ORD-1001'", true),
        ("priority = 4 OR corrid = 'x'", false),
        ("NOT priority = 4", true),
        ("NOT (priority = 3 OR priority = 4)", false),
        ("(priority = 4 OR priority = 3) AND (state = 0)", true),
        ("priority = 4 OR priority = 3 AND state = 1", false), // AND binds tighter
        ("(priority = 4 OR priority = 3) AND state = 1", false),
        ("((((priority = 3))))", true),
        // IS NULL / Oracle empty string
        ("tab.user_data.empty IS NULL", true),
        ("tab.user_data.empty = ''", false),
        ("'' IS NULL", true),
        ("NULL IS NULL", true),
        ("corrid IS NOT NULL", true),
        // BETWEEN
        ("priority BETWEEN 1 AND 5", true),
        ("priority BETWEEN 4 AND 5", false),
        ("priority NOT BETWEEN 4 AND 5", true),
        ("tab.user_data.deptno BETWEEN 50 AND 70", true),
        ("corrid BETWEEN 'ORD' AND 'ORE'", true),
        ("priority BETWEEN 1 AND 5 AND state = 0", true),
        // IN
        ("priority IN (1, 2, 3)", true),
        ("priority IN (1, 2)", false),
        ("priority NOT IN (1, 2)", true),
        ("priority IN (-3, +3)", true),
        ("corrid IN ('a', 'ORD-1001')", true),
        ("tab.user_data.deptno IN (10, 60)", true),
        ("priority IN (1, NULL)", false),
        ("priority IN (3, NULL)", true),
        // LIKE
        ("corrid LIKE 'ORD-____'", true),
        ("corrid LIKE 'ORD-___'", false),
        ("corrid LIKE '%1001'", true),
        ("corrid LIKE '%10%'", true),
        ("corrid LIKE 'ord%'", false),
        ("corrid NOT LIKE 'X%'", true),
        ("corrid LIKE '%'", true),
        ("tab.user_data.note LIKE '100\\% pure\\_%' ESCAPE '\\'", true),
        ("tab.user_data.note LIKE '100!%%' ESCAPE '!'", true),
        ("tab.user_data.note LIKE '100!% pure!_cotton' ESCAPE '!'", true),
        ("tab.user_data.note LIKE '100!%x%' ESCAPE '!'", false),
        ("tab.user_data.note LIKE '%!_%' ESCAPE '!'", true),
        ("'a!b' LIKE 'a!!b' ESCAPE '!'", true),
        ("'aXb' LIKE 'a_b'", true),
        ("'ab' LIKE 'a_b'", false),
        ("'mississippi' LIKE '%iss%ppi'", true),
        ("'mississippi' LIKE 'm%s_s%i'", true),
        ("tab.user_data.deptno LIKE '6%'", true),
        ("priority LIKE '3'", true),
        ("corrid LIKE UPPER('ord') || '%'", true),
        ("corrid LIKE corrid", true),
        // arithmetic
        ("priority + 1 = 4", true),
        ("priority - 1 = 2", true),
        ("priority * 2 = 6", true),
        ("priority / 2 = 1.5", true),
        ("-priority = -3", true),
        ("- -priority = 3", true),
        ("+priority = 3", true),
        ("1 + 2 * 3 = 7", true),
        ("(1 + 2) * 3 = 9", true),
        ("tab.user_data.deptno + 1 = 61", true),
        ("priority / 0 = 1", false),
        ("NOT (priority / 0 = 1)", false),
        ("tab.user_data.notnum + 1 IS NULL", true),
        ("1e2 = 100", true),
        (".5 = 0.5", true),
        // concatenation
        ("corrid || 'x' = 'ORD-1001x'", true),
        ("'a' || NULL = 'a'", true),
        ("'a' || priority = 'a3'", true),
        ("'x' || tab.user_data.sal = 'x1500.5'", true),
        ("NULL || NULL IS NULL", true),
        // functions
        ("UPPER('abc') = 'ABC'", true),
        ("lower(corrid) = 'ord-1001'", true),
        ("LENGTH(corrid) = 8", true),
        ("LENGTH('') IS NULL", true),
        ("SUBSTR(corrid, 1, 3) = 'ORD'", true),
        ("SUBSTR(corrid, 5) = '1001'", true),
        ("SUBSTR(corrid, -4) = '1001'", true),
        ("SUBSTR(corrid, -4, 2) = '10'", true),
        ("SUBSTR(corrid, 0, 3) = 'ORD'", true),
        ("SUBSTR(corrid, 100) IS NULL", true),
        ("SUBSTR(corrid, 1, 0) IS NULL", true),
        ("SUBSTR(corrid, 1.9, 3.9) = 'ORD'", true),
        ("SUBSTR(corrid, 1, 1000000000000) = corrid", true),
        ("TRIM(tab.user_data.ename) = 'Smith'", true),
        ("TRIM(LEADING FROM tab.user_data.ename) = 'Smith  '", true),
        ("TRIM(TRAILING FROM tab.user_data.ename) = '  Smith'", true),
        ("TRIM(BOTH 'x' FROM 'xxaxx') = 'a'", true),
        ("TRIM(LEADING 'x' FROM 'xxaxx') = 'axx'", true),
        ("TRIM('x' FROM 'xxaxx') = 'a'", true),
        ("TRIM('   ') IS NULL", true),
        ("NVL(delay, 0) = 0", true),
        ("NVL(priority, 0) = 3", true),
        ("NVL(nosuch, 'd') = 'd'", true),
        ("NVL(vip, FALSE)", true),
        ("ABS(-5) = 5", true),
        ("ABS('-2.5') = 2.5", true),
        ("ROUND(2.5) = 3", true),
        ("ROUND(-2.5) = -3", true),
        ("ROUND(1.2345, 2) = 1.23", true),
        ("ROUND(1234, -2) = 1200", true),
        ("ROUND(1.5, 1000) = 1.5", true),
        ("ROUND(1.5, -1000) = 0", true),
        ("UPPER(NULL) IS NULL", true),
        ("ABS('x') IS NULL", true),
        // comments and whitespace
        ("priority = 3 -- trailing comment", true),
        ("priority /* inline */ = 3", true),
        ("\n\tpriority\n=\n3\n", true),
        // string literal escape
        ("'it''s' = 'it' || '''s'", true),
        ("N'USA' = Country", true),
        // long flattened chains are fine
        ("priority = 0 OR priority = 1 OR priority = 2 OR priority = 3", true),
    ];
    let mut failures = Vec::new();
    for (cond, expected) in cases {
        let got = check(cond, &ctx);
        if got != *expected {
            failures.push(format!("{cond:?}: expected {expected}, got {got}"));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn deptno_example_with_text_and_number_payloads() {
    let cond = Condition::parse("tab.user_data.deptno=60").expect("parses");
    assert!(cond.references_user_data());
    for v in [t("60"), n(60.0), t(" 60 "), t("60.0"), t("6e1")] {
        assert!(cond.eval(&Ctx::default().data("deptno", v.clone())), "{v:?}");
    }
    for v in [t("61"), n(61.0), t("sixty"), t(""), Value::Null, Value::Bool(true), t("NaN"), t("inf")] {
        assert!(!cond.eval(&Ctx::default().data("deptno", v.clone())), "{v:?}");
    }
    // absent payload attribute
    assert!(!cond.eval(&Ctx::default()));
}

#[test]
fn three_valued_logic() {
    let ctx = std_ctx(); // delay is a known property with a NULL value
    let unknown = [
        "delay = 1",
        "NOT delay = 1",
        "NOT (delay = 1)",
        "NOT NOT (delay = 1)",
        "delay <> 1",
        "delay = NULL",
        "NULL = NULL",
        "delay = 1 AND priority = 3",
        "delay = 1 OR priority = 4",
        "delay BETWEEN 0 AND 10",
        "delay NOT BETWEEN 0 AND 10",
        "delay IN (1, 2)",
        "delay NOT IN (1, 2)",
        "priority NOT IN (1, NULL)",
        "delay LIKE '%'",
        "delay NOT LIKE '%'",
        "priority BETWEEN NULL AND 5",
        "NULL",
        "nosuch",
    ];
    for cond in unknown {
        assert!(!check(cond, &ctx), "{cond} should be UNKNOWN (false)");
    }
    // UNKNOWN absorbed by FALSE in AND and TRUE in OR
    assert!(!check("delay = 1 AND priority = 4", &ctx));
    assert!(check("delay = 1 OR priority = 3", &ctx));
    assert!(check("NOT (delay = 1 AND priority = 4)", &ctx));
    assert!(check("priority NOT BETWEEN 5 AND NULL", &ctx)); // 3 < 5 decides
    assert!(check("delay IS NULL", &ctx));
}

#[test]
fn references_user_data_detection() {
    let yes = [
        "tab.user_data.deptno = 60",
        "priority = 1 OR tab.user_data.x IS NULL",
        "UPPER(tab.user_data.a) = 'A'",
        "corrid LIKE tab.user_data.p",
        "priority IN (1) AND NOT tab.user_data IS NULL",
        "priority BETWEEN 1 AND tab.user_data.max",
    ];
    let no = ["priority = 1", "Country = 'USA' AND corrid LIKE 'A%'", "tab.corrid = 'x'"];
    for c in yes {
        assert!(Condition::parse(c).expect("parses").references_user_data(), "{c}");
    }
    for c in no {
        assert!(!Condition::parse(c).expect("parses").references_user_data(), "{c}");
    }
}

#[test]
fn payload_path_segments() {
    struct PathCtx;
    impl ConditionContext for PathCtx {
        fn property(&self, _: &str) -> Option<Value> {
            None
        }
        fn user_data(&self, path: &[String]) -> Value {
            Value::Text(path.join("/"))
        }
        fn user_property(&self, _: &str) -> Value {
            Value::Null
        }
    }
    assert!(check("tab.user_data.Customer.COUNTRY = 'customer/country'", &PathCtx));
    assert!(check("tab.user_data.\"MixedCase\".x = 'MixedCase/x'", &PathCtx));
    assert!(check("tab.user_data.header.properties.p = 'header/properties/p'", &PathCtx));
    assert!(check("tab.user_data.date = 'date'", &PathCtx)); // keywords fine after `.`
    assert!(check("tab.user_data.\"select\" = 'select'", &PathCtx));
    assert!(Condition::parse("tab.user_data.select = 'select'").is_err()); // SELECT is refused unquoted
    assert!(check("tab.user_data IS NULL", &PathCtx)); // empty path -> "" -> NULL
}

fn expect_err(cond: &str) -> ConditionError {
    match Condition::parse(cond) {
        Ok(c) => panic!("{cond:?} unexpectedly parsed: {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn injection_and_unsupported_inputs_are_rejected() {
    use ConditionError::*;
    type IsExpected = fn(&ConditionError) -> bool;
    let cases: &[(&str, IsExpected, &str)] = &[
        ("1=1; DROP TABLE x", |e| matches!(e, Unsupported(_)), "`;`"),
        ("priority = 1;", |e| matches!(e, Unsupported(_)), "`;`"),
        ("(SELECT 1)", |e| matches!(e, Unsupported(_)), "subquery"),
        ("priority IN (SELECT priority FROM t)", |e| matches!(e, Unsupported(_)), "subquery"),
        ("EXISTS (SELECT 1)", |e| matches!(e, Unsupported(_)), "subquery"),
        ("NOT EXISTS (x)", |e| matches!(e, Unsupported(_)), "EXISTS"),
        ("deptno = 60 UNION SELECT", |e| matches!(e, Unsupported(_)), "subquery"),
        ("deptno = 60 UNION ALL", |e| matches!(e, Parse(_)), "after the end"),
        ("DBMS_LOCK.SLEEP(10)", |e| matches!(e, Unsupported(_)), "DBMS_LOCK.SLEEP"),
        ("DBMS_LOCK.SLEEP(10) = 1", |e| matches!(e, Unsupported(_)), "DBMS_LOCK.SLEEP"),
        ("priority = SLEEP(10)", |e| matches!(e, Unsupported(_)), "SLEEP"),
        ("utl_http.request('http://evil') IS NULL", |e| matches!(e, Unsupported(_)), "utl_http.request"),
        (
            "tab.user_data.xdata.extract('/ORDER_TYP/CUSTOMER/COUNTRY/text()').getStringVal()='CANADA'",
            |e| matches!(e, Unsupported(_)),
            "function call",
        ),
        ("\"UPPER\"(corrid) = 'A'", |e| matches!(e, Unsupported(_)), "function call"),
        ("CAST(priority AS VARCHAR(10)) = '1'", |e| matches!(e, Unsupported(_)), "CAST"),
        ("CASE WHEN priority = 1 THEN 1 END = 1", |e| matches!(e, Unsupported(_)), "CASE"),
        ("enq_time > SYSDATE - 1", |e| matches!(e, Unsupported(_)), "SYSDATE"),
        ("enq_time > CURRENT_TIMESTAMP", |e| matches!(e, Unsupported(_)), "CURRENT_TIMESTAMP"),
        ("USER = 'SYS'", |e| matches!(e, Unsupported(_)), "USER"),
        ("priority = :1", |e| matches!(e, Unsupported(_)), "`:`"),
        ("priority = ?", |e| matches!(e, Unsupported(_)), "placeholder"),
        ("priority = $1", |e| matches!(e, Unsupported(_)), "placeholder"),
        ("priority % 2 = 0", |e| matches!(e, Unsupported(_)), "%"),
        ("priority::text = '1'", |e| matches!(e, Unsupported(_)), "::"),
        ("tab.user_data.items[1] = 2", |e| matches!(e, Unsupported(_)), "["),
        ("corrid ILIKE 'a%'", |e| matches!(e, Unsupported(_)), "ILIKE"),
        ("corrid SIMILAR TO 'a%'", |e| matches!(e, Unsupported(_)), "SIMILAR"),
        ("corrid REGEXP 'a'", |e| matches!(e, Unsupported(_)), "REGEXP"),
        ("priority IS TRUE", |e| matches!(e, Unsupported(_)), "IS"),
        ("priority IS DISTINCT FROM 1", |e| matches!(e, Unsupported(_)), "DISTINCT"),
        ("priority IN (1, priority)", |e| matches!(e, Unsupported(_)), "literal"),
        ("priority IN (1 + 1)", |e| matches!(e, Unsupported(_)), "literal"),
        ("priority = ANY (1, 2)", |e| matches!(e, Unsupported(_) | Parse(_)), ""),
        ("x.y = 1", |e| matches!(e, Unsupported(_)), "qualified name"),
        ("user_data.deptno = 1", |e| matches!(e, Unsupported(_)), "qualified name"),
        ("tab.a.b = 1", |e| matches!(e, Unsupported(_)), "qualified name"),
        ("(priority, corrid) = (1, 'a')", |e| matches!(e, Parse(_) | Unsupported(_)), ""),
        ("INTERVAL '1' DAY", |e| matches!(e, Unsupported(_)), "INTERVAL"),
        ("X'41' = 'A'", |e| matches!(e, Unsupported(_)), ""),
        ("priority & 1 = 1", |e| matches!(e, Unsupported(_)), "&"),
        ("`priority` = 1", |e| matches!(e, Parse(_) | Unsupported(_)), ""),
        ("SUBSTRING(corrid FROM 1 FOR 2) = 'OR'", |e| matches!(e, Unsupported(_)), "SUBSTRING"),
        // syntax / arity / kind errors
        ("", |e| matches!(e, Parse(_)), "empty"),
        ("   -- only a comment", |e| matches!(e, Parse(_)), "empty"),
        ("priority =", |e| matches!(e, Parse(_)), ""),
        ("priority = 1 AND", |e| matches!(e, Parse(_)), ""),
        ("(priority = 1", |e| matches!(e, Parse(_)), ""),
        ("priority = 1)", |e| matches!(e, Parse(_)), ""),
        ("'unterminated", |e| matches!(e, Parse(_)), ""),
        ("priority = 1 priority = 2", |e| matches!(e, Parse(_)), "after the end"),
        ("60", |e| matches!(e, Parse(_)), "boolean"),
        ("priority + 1", |e| matches!(e, Parse(_)), "boolean"),
        ("1 AND 2", |e| matches!(e, Parse(_)), "value"),
        ("NOT 'x'", |e| matches!(e, Parse(_)), "value"),
        ("(priority = 1) + 1 = 2", |e| matches!(e, Unsupported(_)), "condition used as a value"),
        ("(priority = 1) = TRUE", |e| matches!(e, Unsupported(_)), "condition used as a value"),
        ("UPPER() = 'a'", |e| matches!(e, Parse(_)), "expects"),
        ("UPPER(corrid, 1) = 'a'", |e| matches!(e, Parse(_)), "expects"),
        ("SUBSTR(corrid) = 'a'", |e| matches!(e, Parse(_)), "expects"),
        ("NVL(corrid) = 'a'", |e| matches!(e, Parse(_)), "expects"),
        ("TRIM('xy' FROM corrid) = 'a'", |e| matches!(e, Parse(_)), "single character"),
        ("TRIM(LEADING corrid) = 'a'", |e| matches!(e, Parse(_)), "FROM"),
        ("corrid LIKE 'a' ESCAPE 'xy'", |e| matches!(e, Parse(_)), "ESCAPE"),
        ("corrid LIKE 'a!b' ESCAPE '!'", |e| matches!(e, Parse(_)), "escape"),
        ("corrid LIKE 'ab!' ESCAPE '!'", |e| matches!(e, Parse(_)), "escape"),
        ("priority = 1e999", |e| matches!(e, Parse(_)), "number"),
    ];
    let mut failures = Vec::new();
    for (cond, ok, needle) in cases {
        let e = expect_err(cond);
        let msg = e.to_string();
        if !ok(&e) || !msg.to_lowercase().contains(&needle.to_lowercase()) {
            failures.push(format!("{cond:?}: got {e:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A classic tautology is just a (true) condition: harmless, never SQL.
    assert!(check("deptno = 60 OR 1=1 --", &std_ctx()));
}

#[test]
fn length_and_depth_limits() {
    assert_eq!(expect_err(&"(".repeat(10_000)), ConditionError::TooLong);
    assert_eq!(
        expect_err(&format!("{}priority = 1{}", "(".repeat(10_000), ")".repeat(10_000))),
        ConditionError::TooLong
    );
    assert_eq!(expect_err(&"(".repeat(3_000)), ConditionError::TooDeep);
    let over = MAX_DEPTH + 1;
    assert_eq!(expect_err(&format!("{}priority = 3{}", "(".repeat(over), ")".repeat(over))), ConditionError::TooDeep);
    // exactly at the limit parses (parser thread has a big stack even in debug)
    let at = MAX_DEPTH - 2;
    assert!(check(&format!("{}priority = 3{}", "(".repeat(at), ")".repeat(at)), &std_ctx()));
    // deep chains without parentheses
    assert_eq!(expect_err(&format!("{}priority = 3", "NOT ".repeat(990))), ConditionError::TooDeep);
    assert_eq!(expect_err(&format!("priority = {}3", "- ".repeat(1_990))), ConditionError::TooDeep);
    assert_eq!(expect_err(&format!("priority = {}3", "+-".repeat(1_950))), ConditionError::TooDeep);
    assert!(check(&format!("{}priority = 3", "NOT NOT ".repeat(10)), &std_ctx()));
    // left-deep arithmetic counts, flattened OR/AND chains do not
    assert_eq!(expect_err(&format!("priority{} = 3", " + 0".repeat(500))), ConditionError::TooDeep);
    let ors = vec!["priority=9"; 250].join(" OR ") + " OR priority=3";
    assert!(check(&ors, &std_ctx()));
    // exactly 4000 characters is allowed, 4001 is not
    let pad = |len: usize| format!("priority = 3{}", " ".repeat(len - 12));
    assert!(Condition::parse(&pad(4000)).is_ok());
    assert_eq!(expect_err(&pad(4001)), ConditionError::TooLong);
    // characters, not bytes
    let multibyte = format!("corrid = '{}'", "é".repeat(3_900));
    assert!(Condition::parse(&multibyte).is_ok());
}

/// Short conditions are parsed on the caller's stack: the worst cases at the
/// inline token limit must fit a small thread stack (measured: < 600 KiB in
/// debug, < 128 KiB in release). Longer input goes to the big-stack thread.
#[test]
fn parsing_fits_small_caller_stacks() {
    let inline = [
        format!("{}vip", "NOT ".repeat(INLINE_MAX_TOKENS - 1)),
        format!("x = {}1", "- ".repeat(INLINE_MAX_TOKENS - 3)),
        format!("{}vip{}", "(".repeat(7), ")".repeat(7)),
        format!("x = {}1{}", "UPPER(".repeat(6), ")".repeat(6)),
        "a BETWEEN 1 + 1 AND - - 2 OR NOT x LIKE 'a'".to_string(),
    ];
    let deep = [
        format!("{}vip", "NOT ".repeat(MAX_DEPTH - 4)),
        format!("{}vip{}", "(".repeat(MAX_DEPTH - 2), ")".repeat(MAX_DEPTH - 2)),
        format!("{}vip", "NOT ".repeat(990)),
    ];
    for (input, stack) in inline.iter().map(|s| (s, 1024 * 1024)).chain(deep.iter().map(|s| (s, 256 * 1024))) {
        let s = input.clone();
        let handle = std::thread::Builder::new()
            .stack_size(stack)
            .spawn(move || Condition::parse(&s).map(|_| ()))
            .expect("spawn test thread");
        let result = handle.join().expect("no panic");
        assert!(result.is_ok() || result == Err(ConditionError::TooDeep), "{input:?}: {result:?}");
    }
}

/// The stock sqlparser prefix parser backtracks exponentially on failing
/// nested keyword constructs; the dialect hook must keep these linear.
#[test]
fn pathological_nesting_is_fast() {
    let prefixes = [
        "NOT (",
        "NOT(",
        "CAST(",
        "CAST(CAST(",
        "POSITION(",
        "CEIL(",
        "SUBSTRING(",
        "CASE (",
        "UPPER(",
        "TRIM(",
        "NVL(a, ",
        "(",
        "- (",
        "x IN (",
        "CURRENT_DATE(",
        "(NOT (",
    ];
    for p in prefixes {
        let opens = p.matches('(').count();
        let levels = (MAX_DEPTH / opens).min(60);
        for inner in ["a b", "a = 1 +", ")", "a = 1", ""] {
            let cond = format!("{}{}{}", p.repeat(levels), inner, ")".repeat(levels * opens));
            let start = Instant::now();
            let _ = Condition::parse(&cond);
            assert!(start.elapsed() < Duration::from_secs(2), "{cond:?} took {:?}", start.elapsed());
        }
    }
}

#[test]
fn like_matcher() {
    let m = |text: &str, pat: &str, esc: Option<char>| {
        let toks = compile_like(pat, esc).expect("valid pattern");
        like_match(&text.chars().collect::<Vec<_>>(), &toks, &mut Budget::new(u64::MAX, usize::MAX)).expect("budget")
    };
    assert!(m("", "", None));
    assert!(m("", "%", None));
    assert!(m("", "%%", None));
    assert!(!m("", "_", None));
    assert!(m("abc", "abc", None));
    assert!(m("abc", "a%c", None));
    assert!(m("abc", "%b%", None));
    assert!(m("abc", "___", None));
    assert!(!m("abc", "____", None));
    assert!(m("aaa", "%a", None));
    assert!(m("ab_c", "ab\\_c", Some('\\')));
    assert!(!m("abXc", "ab\\_c", Some('\\')));
    assert!(m("ünïcødé", "_n%d_", None));
    assert!(!m("abc", "ABC", None));
    // worst-case-ish input takes a few steps per character
    let text: Vec<char> = "a".repeat(20_000).chars().collect();
    let toks = compile_like(&format!("{}b", "%a".repeat(1_000)), None).expect("valid");
    let mut b = Budget::new(u64::MAX, usize::MAX);
    assert_eq!(like_match(&text, &toks, &mut b), Ok(false));
    assert!(b.used() < 100_000, "{}", b.used());
    assert!(compile_like("a!", Some('!')).is_err());
    assert!(compile_like("a!x", Some('!')).is_err());
}

#[test]
fn dynamic_like_pattern_errors_are_unknown() {
    let ctx = std_ctx().user("pat", t("ORD!x")).user("good", t("ORD-!%%"));
    assert!(!check("corrid LIKE pat ESCAPE '!'", &ctx));
    assert!(!check("NOT (corrid LIKE pat ESCAPE '!')", &ctx));
    assert!(!check("corrid LIKE good ESCAPE '!'", &ctx)); // needs a literal '%'
    let ctx = ctx.user("pct", t("100%")).user("good2", t("100!%"));
    assert!(check("pct LIKE good2 ESCAPE '!'", &ctx));
    assert!(!check("pct LIKE good", &ctx));
}

#[test]
fn number_parsing_and_formatting() {
    assert_eq!(parse_number("60"), Some(60.0));
    assert_eq!(parse_number(" -1.5e3 "), Some(-1500.0));
    assert_eq!(parse_number(".5"), Some(0.5));
    assert_eq!(parse_number("5."), Some(5.0));
    for bad in ["", ".", "e5", "1e", "inf", "NaN", "0x10", "1,5", "--1", "1e400", "6O"] {
        assert_eq!(parse_number(bad), None, "{bad:?}");
    }
    assert_eq!(fmt_num(60.0), "60");
    assert_eq!(fmt_num(-0.0), "0");
    assert_eq!(fmt_num(1500.5), "1500.5");
    assert_eq!(round_half_away(0.125, 2), 0.13);
    assert_eq!(round_half_away(-15.0, -1), -20.0);
}

#[test]
fn errors_display_clearly() {
    let e = expect_err("DBMS_LOCK.SLEEP(10)");
    assert_eq!(e.to_string(), "unsupported in a condition: function call `DBMS_LOCK.SLEEP(...)`");
    assert_eq!(ConditionError::TooLong.to_string(), "condition exceeds 4000 characters");
    let parsed: Result<Condition, _> = "priority = 1".parse();
    assert!(parsed.is_ok());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    const ATOMS: &[&str] = &[
        "(",
        ")",
        "NOT",
        "AND",
        "OR",
        "=",
        "<>",
        "<",
        ">=",
        "+",
        "-",
        "*",
        "/",
        "||",
        ",",
        "IS",
        "NULL",
        "IN",
        "BETWEEN",
        "LIKE",
        "ESCAPE",
        "'%a_'",
        "'!'",
        "1",
        "2.5",
        "priority",
        "corrid",
        "tab.user_data.deptno",
        "tab.user_data",
        "Country",
        "\"q\"",
        "UPPER",
        "SUBSTR",
        "TRIM",
        "FROM",
        "LEADING",
        "NVL",
        "ROUND",
        "ABS",
        "LENGTH",
        "TRUE",
        "FALSE",
        "SELECT",
        "CAST",
        ";",
        "'",
        "\"",
        ".",
        "CASE",
        "EXISTS",
        "DBMS_LOCK.SLEEP",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn random_text_never_panics(s in "\\PC{0,300}") {
            let _ = Condition::parse(&s);
        }

        #[test]
        fn random_token_soup_never_panics(
            atoms in proptest::collection::vec(proptest::sample::select(ATOMS), 0..80)
        ) {
            let s = atoms.join(" ");
            if let Ok(c) = Condition::parse(&s) {
                let _ = c.eval(&std_ctx());
                let _ = c.eval(&Ctx::default());
                let _ = c.references_user_data();
            }
        }

        #[test]
        fn comparison_with_numeric_text_matches_number(x in -1.0e9f64..1.0e9, y in -1.0e9f64..1.0e9) {
            let ctx = Ctx::default().data("a", Value::Text(format!("{x}")));
            let cond = Condition::parse(&format!("tab.user_data.a < {y}")).expect("parses");
            prop_assert_eq!(cond.eval(&ctx), x < y);
        }
    }
}
