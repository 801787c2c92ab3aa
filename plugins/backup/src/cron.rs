//! The schedule check the CronJob API makes, made before the CronJob is
//! applied, so a schedule the API server would refuse is reported on the
//! Backup (`Scheduled=False`, reason `InvalidSchedule`, and a Warning
//! Event) instead of failing every apply.
//!
//! The Backup CRD's pattern lets through schedules the CronJob API refuses
//! (upstream's e2e case `*/5 */0 * * *`: a step of 0). The CronJob API
//! parses `spec.schedule` as a standard cron line (five fields, or one of
//! the `@` descriptors) and refuses any `TZ`/`CRON_TZ` in it; this module
//! applies the same rules: per field, a comma-separated list of `*`, `?`,
//! `N`, `N-M` or names (`jan`–`dec`, `sun`–`sat`, any case), each with an
//! optional `/step`; `N/step` runs from N to the field's maximum. Bounds:
//! minute 0–59, hour 0–23, day of month 1–31, month 1–12, day of week 0–6.
//!
//! What it cannot check: time zone names (the API server's tz database
//! decides); a zone it refuses still fails the apply, which the host
//! reports on the `Reconciled` condition.

/// One field's bounds and names.
struct Field {
    what: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

const FIELDS: [Field; 5] = [
    Field {
        what: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        what: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    Field {
        what: "day of month",
        min: 1,
        max: 31,
        names: &[],
    },
    Field {
        what: "month",
        min: 1,
        max: 12,
        names: &MONTHS,
    },
    Field {
        what: "day of week",
        min: 0,
        max: 6,
        names: &DAYS,
    },
];

/// The descriptors the CronJob API accepts besides `@every <duration>`.
const DESCRIPTORS: [&str; 7] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
];

/// Checks `schedule` as the CronJob API does.
///
/// # Errors
///
/// Why the CronJob API would refuse it, for a person.
pub fn check_schedule(schedule: &str) -> Result<(), String> {
    if schedule.contains("TZ") {
        return Err(
            "TZ or CRON_TZ in the schedule is refused by the CronJob API; use spec.etcd.timeZone"
                .to_owned(),
        );
    }
    if schedule.is_empty() {
        return Err("the schedule is empty".to_owned());
    }
    if let Some(rest) = schedule.strip_prefix("@every ") {
        return check_duration(rest.trim());
    }
    if schedule.starts_with('@') {
        return if DESCRIPTORS.contains(&schedule) {
            Ok(())
        } else {
            Err(format!("unrecognized descriptor {schedule:?}"))
        };
    }
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    if fields.len() != FIELDS.len() {
        return Err(format!(
            "expected exactly 5 fields (minute hour day-of-month month day-of-week), found {}",
            fields.len()
        ));
    }
    for (text, field) in fields.iter().zip(&FIELDS) {
        for part in text.split(',') {
            check_range(part, field)
                .map_err(|why| format!("{} field {text:?}: {why}", field.what))?;
        }
    }
    Ok(())
}

/// One `range[/step]` of a field.
fn check_range(expr: &str, field: &Field) -> Result<(), String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_and_high: Vec<&str> = range_and_step[0].split('-').collect();
    let (start, mut end) = if low_and_high[0] == "*" || low_and_high[0] == "?" {
        (field.min, field.max)
    } else {
        let start = int_or_name(low_and_high[0], field)?;
        match low_and_high.len() {
            1 => (start, start),
            2 => (start, int_or_name(low_and_high[1], field)?),
            _ => return Err(format!("too many hyphens in {expr:?}")),
        }
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            if low_and_high.len() == 1 {
                end = field.max;
            }
            int(range_and_step[1])?
        }
        _ => return Err(format!("too many slashes in {expr:?}")),
    };
    if start < field.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({})",
            field.min
        ));
    }
    if end > field.max {
        return Err(format!(
            "end of range ({end}) above maximum ({})",
            field.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end})"
        ));
    }
    if step == 0 {
        return Err(format!("the step of {expr:?} must be a positive number"));
    }
    Ok(())
}

fn int_or_name(text: &str, field: &Field) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    match field.names.iter().position(|n| *n == lower) {
        // Months are numbered from 1, days from 0.
        Some(i) => Ok(u32::try_from(i).unwrap_or(0) + field.min),
        None => int(text),
    }
}

fn int(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if let Some(negative) = digits.strip_prefix('-')
        && !negative.is_empty()
        && negative.chars().all(|c| c.is_ascii_digit())
    {
        return Err(format!("negative number ({text}) not allowed"));
    }
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("{text:?} is not a number"));
    }
    digits
        .parse::<u32>()
        .map_err(|_| format!("{text:?} is out of range"))
}

/// `@every <duration>`: a Go duration (`1h30m`, `90s`, `1.5h`).
fn check_duration(text: &str) -> Result<(), String> {
    let bad = || format!("@every {text:?}: not a duration such as 1h30m");
    if text.is_empty() {
        return Err(bad());
    }
    let mut rest = text.strip_prefix(['+', '-']).unwrap_or(text);
    if rest == "0" {
        return Ok(());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_len];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(bad());
        }
        rest = &rest[number_len..];
        let unit = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .into_iter()
            .filter(|u| rest.starts_with(u))
            .max_by_key(|u| u.len())
            .ok_or_else(bad)?;
        rest = &rest[unit.len()..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_cronjob_api_accepts() {
        for ok in [
            "0 2 * * *",
            "*/5 * * * *",
            "0 22 * * 1-5",
            "5 4 * * SUN",
            "0 0 1 jan,jul *",
            "30 3 * * 1-5",
            "0 0 ? * *",
            "5/15 * * * *",
            "@hourly",
            "@weekly",
            "@every 1h30m",
            "* * * * *",
        ] {
            assert_eq!(check_schedule(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn what_the_cronjob_api_refuses_with_the_reason() {
        for (bad, why) in [
            // Upstream's TestWrongScheduleDegradesOperator.
            (
                "*/5 */0 * * *",
                "hour field \"*/0\": the step of \"*/0\" must be a positive number",
            ),
            (
                "60 * * * *",
                "minute field \"60\": end of range (60) above maximum (59)",
            ),
            (
                "* 5-2 * * *",
                "beginning of range (5) beyond end of range (2)",
            ),
            ("* * 0 * *", "beginning of range (0) below minimum (1)"),
            ("* * * * 7", "end of range (7) above maximum (6)"),
            ("* * * * FOO", "\"FOO\" is not a number"),
            ("* * * *", "expected exactly 5 fields"),
            ("0 0 * * * *", "found 6"),
            ("1-2-3 * * * *", "too many hyphens"),
            ("*/2/3 * * * *", "too many slashes"),
            ("@hourli", "unrecognized descriptor"),
            ("@every soon", "not a duration"),
            ("CRON_TZ=UTC 0 2 * * *", "use spec.etcd.timeZone"),
        ] {
            let err = check_schedule(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
