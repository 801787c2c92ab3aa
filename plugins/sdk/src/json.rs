//! Compact JSON text of what a plugin returns, byte for byte what
//! `serde_json::to_string` writes, found faster for strings.
//!
//! serde_json looks at a string one byte per loop turn for what it must
//! escape; in a plugin every loop turn also pays the host's deadline check
//! (an epoch check at each loop back-edge). Most strings of a Kubernetes
//! object need no escape: [`needs_escape`] tells 16 bytes per turn (a
//! string under 8 bytes without a loop), and such a string is copied whole. A string that needs escapes, and every
//! floating-point number, is written by serde_json itself, and serde_json's
//! special forms (a number of its `arbitrary_precision` feature, a
//! `RawValue`: a struct named `$serde_json::private::…`) are written
//! verbatim as serde_json writes them, so the text is the same either way
//! (the tests compare them).

use std::fmt::{self, Display, Write as _};

use serde::ser::{self, Serialize};

/// `value` as compact JSON text, as `serde_json::to_string` writes it.
///
/// # Errors
///
/// What serde_json refuses too: a map key that is not a string, a number,
/// a bool or a unit variant; an error raised by `value`'s `Serialize`.
pub(crate) fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    let mut out = String::with_capacity(256);
    value.serialize(Writer { out: &mut out })?;
    Ok(out)
}

/// `s` as a JSON string, quoted and escaped as serde_json writes it.
pub(crate) fn write_str(s: &str, out: &mut String) {
    if needs_escape(s.as_bytes()) {
        // serde_json's escaping, for exactly its text. A `&str` always
        // serializes.
        if let Ok(text) = serde_json::to_string(s) {
            out.push_str(&text);
        }
    } else {
        out.push('"');
        out.push_str(s);
        out.push('"');
    }
}

/// True when `bytes` holds a byte below 0x20, `"` or `\` (what JSON
/// escapes).
///
/// Looked at 16 bytes per loop turn, the last partial turn as one word that
/// overlaps the one before it, and strings under 8 bytes (most keys of a
/// Kubernetes object) without a loop at all: in a plugin every loop turn
/// also pays the deadline's epoch check.
pub(crate) fn needs_escape(bytes: &[u8]) -> bool {
    let n = bytes.len();
    if n >= 8 {
        let mut pairs = bytes.chunks_exact(16);
        for pair in &mut pairs {
            let (a, b) = pair.split_at(8);
            if escapes_in(word(a)) | escapes_in(word(b)) != 0 {
                return true;
            }
        }
        let rest = pairs.remainder();
        // At most 15 bytes are left: the first 8 of them, then the last 8
        // of the string (which may overlap bytes already looked at).
        (rest.len() >= 8 && escapes_in(word(rest)) != 0)
            || (!rest.is_empty() && escapes_in(word(&bytes[n - 8..])) != 0)
    } else if n >= 4 {
        // Two 4-byte halves that overlap when n < 8.
        let low = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let high = u32::from_le_bytes([bytes[n - 4], bytes[n - 3], bytes[n - 2], bytes[n - 1]]);
        escapes_in(u64::from(low) | u64::from(high) << 32) != 0
    } else {
        // 0 to 3 bytes: the first, middle and last cover them all.
        let escaped = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
        n > 0 && (escaped(bytes[0]) || escaped(bytes[n / 2]) || escaped(bytes[n - 1]))
    }
}

/// The first 8 bytes of `bytes` as one word, the first byte lowest.
fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(w)
}

/// Nonzero exactly when some byte of `x` is below 0x20, `"` or `\`.
fn escapes_in(x: u64) -> u64 {
    const ONES: u64 = u64::MAX / 255;
    const HIGHS: u64 = ONES * 0x80;
    // Nonzero exactly when some byte of `x` is below `n` (n ≤ 0x80).
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGHS;
    let quote = x ^ (ONES * u64::from(b'"'));
    let backslash = x ^ (ONES * u64::from(b'\\'));
    below(x, 0x20) | below(quote, 1) | below(backslash, 1)
}

/// Why a value has no JSON text.
#[derive(Debug)]
pub(crate) struct Error(String);

impl Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error(e.to_string())
    }
}

/// The ten integer methods of a `Serializer`, each handing its value to
/// `self.$with(v)`.
macro_rules! integers {
    ($with:ident) => {
        integers!($with: serialize_i8 i8, serialize_i16 i16, serialize_i32 i32,
            serialize_i64 i64, serialize_i128 i128, serialize_u8 u8, serialize_u16 u16,
            serialize_u32 u32, serialize_u64 u64, serialize_u128 u128);
    };
    ($with:ident: $($method:ident $ty:ty),*) => {
        $(fn $method(self, v: $ty) -> Result<(), Error> {
            self.$with(v)
        })*
    };
}

/// A value's text appended to `out`.
struct Writer<'a> {
    out: &'a mut String,
}

impl Writer<'_> {
    fn display(self, v: impl Display) -> Result<(), Error> {
        let _ = write!(self.out, "{v}");
        Ok(())
    }

    fn by_serde_json(self, v: &impl Serialize) -> Result<(), Error> {
        self.out.push_str(&serde_json::to_string(v)?);
        Ok(())
    }
}

impl<'a> ser::Serializer for Writer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Map<'a>;
    type SerializeStruct = Map<'a>;
    type SerializeStructVariant = Map<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    // Integers: `Display` writes what serde_json (itoa) writes.
    integers!(display);
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.by_serde_json(&v)
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.by_serde_json(&v)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        write_str(v.encode_utf8(&mut [0; 4]), self.out);
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        write_str(v, self.out);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        self.by_serde_json(&v)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.out.push('{');
        write_str(variant, self.out);
        self.out.push(':');
        value.serialize(Writer { out: self.out })?;
        self.out.push('}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, Error> {
        self.out.push('[');
        Ok(Seq {
            out: self.out,
            first: true,
            close: "]",
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Seq<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, Error> {
        self.out.push('{');
        write_str(variant, self.out);
        self.out.push_str(":[");
        Ok(Seq {
            out: self.out,
            first: true,
            close: "]}",
        })
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Map<'a>, Error> {
        self.out.push('{');
        Ok(Map {
            out: self.out,
            first: true,
            close: "}",
            verbatim: None,
        })
    }
    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Map<'a>, Error> {
        if name.starts_with(SPECIAL) {
            // A number of serde_json's `arbitrary_precision` or a
            // `RawValue` (features a plugin's other dependencies may turn
            // on): one field, a string, its text written as it is.
            let start = self.out.len();
            return Ok(Map {
                out: self.out,
                first: true,
                close: "",
                verbatim: Some(start),
            });
        }
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Map<'a>, Error> {
        self.out.push('{');
        write_str(variant, self.out);
        self.out.push_str(":{");
        Ok(Map {
            out: self.out,
            first: true,
            close: "}}",
            verbatim: None,
        })
    }
}

/// The elements of an array.
struct Seq<'a> {
    out: &'a mut String,
    first: bool,
    close: &'static str,
}

impl Seq<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        value.serialize(Writer { out: self.out })
    }

    fn close(self) -> Result<(), Error> {
        self.out.push_str(self.close);
        Ok(())
    }
}

macro_rules! seq_impls {
    ($($trait:ident $method:ident),*) => {
        $(impl ser::$trait for Seq<'_> {
            type Ok = ();
            type Error = Error;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }
            fn end(self) -> Result<(), Error> {
                self.close()
            }
        })*
    };
}

seq_impls!(
    SerializeSeq serialize_element,
    SerializeTuple serialize_element,
    SerializeTupleStruct serialize_field,
    SerializeTupleVariant serialize_field
);

/// The string a JSON string literal of [`write_str`] holds (its escapes
/// undone: those serde_json writes, `\"`, `\\`, `\b`, `\f`, `\n`,
/// `\r`, `\t` and `\u00XX`, and `\/`); `None` for anything else. Small on
/// purpose: serde_json's own parser for a `String` would add kilobytes to
/// every plugin for what only serde_json's rare special forms need.
fn unquote(quoted: &str) -> Option<String> {
    let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => {
                let hex: String = chars.by_ref().take(4).collect();
                if hex.len() != 4 {
                    return None;
                }
                char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
            }
            _ => return None,
        });
    }
    Some(out)
}

/// How serde_json's special forms name their struct (and field).
const SPECIAL: &str = "$serde_json::private::";

/// The entries of an object.
struct Map<'a> {
    out: &'a mut String,
    first: bool,
    close: &'static str,
    /// A serde_json special form: where its field's text starts (written
    /// as a JSON string, unquoted at the end).
    verbatim: Option<usize>,
}

impl Map<'_> {
    /// The comma before every entry but the first.
    fn separate(&mut self) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
    }
}

impl ser::SerializeMap for Map<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.separate();
        key.serialize(Key { out: self.out })?;
        self.out.push(':');
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(Writer { out: self.out })
    }
    fn end(self) -> Result<(), Error> {
        self.out.push_str(self.close);
        Ok(())
    }
}

impl ser::SerializeStruct for Map<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        // One call of the field's serializer for both kinds of struct: a
        // second, for special forms only, would be a second copy of every
        // field type's code in every plugin.
        if self.verbatim.is_none() {
            self.separate();
            write_str(key, self.out);
            self.out.push(':');
        }
        value.serialize(Writer { out: self.out })
    }
    fn end(self) -> Result<(), Error> {
        if let Some(start) = self.verbatim {
            let quoted = self.out.split_off(start);
            let text = unquote(&quoted)
                .ok_or_else(|| Error(format!("a serde_json special form of {quoted}")))?;
            self.out.push_str(&text);
        }
        self.out.push_str(self.close);
        Ok(())
    }
}

impl ser::SerializeStructVariant for Map<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        ser::SerializeStruct::serialize_field(self, key, value)
    }
    fn end(self) -> Result<(), Error> {
        ser::SerializeStruct::end(self)
    }
}

/// A map key: a string, or what serde_json turns into one (numbers and
/// bools, written quoted by serde_json itself); anything else is refused,
/// as serde_json refuses it.
struct Key<'a> {
    out: &'a mut String,
}

impl Key<'_> {
    /// A number or bool as a key: its text, quoted (as serde_json writes
    /// it).
    fn quoted(self, v: impl Serialize) -> Result<(), Error> {
        self.out.push('"');
        v.serialize(Writer { out: self.out })?;
        self.out.push('"');
        Ok(())
    }
}

impl ser::Serializer for Key<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = ser::Impossible<(), Error>;
    type SerializeTuple = ser::Impossible<(), Error>;
    type SerializeTupleStruct = ser::Impossible<(), Error>;
    type SerializeTupleVariant = ser::Impossible<(), Error>;
    type SerializeMap = ser::Impossible<(), Error>;
    type SerializeStruct = ser::Impossible<(), Error>;
    type SerializeStructVariant = ser::Impossible<(), Error>;

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        write_str(v, self.out);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    integers!(quoted);
    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.quoted(v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        if !v.is_finite() {
            return Err(Error("float key must be finite".to_owned()));
        }
        self.quoted(v)
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        if !v.is_finite() {
            return Err(Error("float key must be finite".to_owned()));
        }
        self.quoted(v)
    }

    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Error> {
        Err(key_error())
    }
    fn serialize_none(self) -> Result<(), Error> {
        Err(key_error())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        Err(key_error())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        Err(key_error())
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Error> {
        Err(key_error())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(key_error())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        Err(key_error())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(key_error())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(key_error())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(key_error())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        Err(key_error())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(key_error())
    }
}

fn key_error() -> Error {
    Error("key must be a string".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    /// Every byte value at every place of a word and of the tail: the
    /// 8-byte test agrees with the byte-by-byte one.
    #[test]
    fn needs_escape_agrees_with_a_byte_by_byte_test() {
        let slow = |bytes: &[u8]| bytes.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
        // Every path: under 4, under 8, one or two words, 16-byte turns
        // with 0, 1-7 and 8-15 bytes left.
        for len in 1..=40 {
            for at in 0..len {
                for byte in 0..=255u8 {
                    for fill in [b'a', 0xc3, 0x7f, b'!', 0xff, 0x20, 0x5d] {
                        let mut bytes = vec![fill; len];
                        bytes[at] = byte;
                        assert_eq!(
                            needs_escape(&bytes),
                            slow(&bytes),
                            "{bytes:?} (byte {byte:#x} at {at} of {len})"
                        );
                    }
                }
            }
        }
        assert!(!needs_escape(b""));
    }

    fn same_as_serde_json<T: Serialize + ?Sized>(value: &T) {
        let expected = serde_json::to_string(value).expect("serde_json writes it");
        assert_eq!(to_string(value).expect("written"), expected);
    }

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        same_as_serde_json(&json!({
            "plain": "nginx:1.27 -- a/b?c=d&e",
            "quote\"key": "say \"hi\"",
            "back\\slash": "C:\\dir\\file",
            "control": "line\nnext\ttab\u{1}\u{1f}",
            "del and unicode": "\u{7f} café ünïcödé 日本 🚀",
            "numbers": [0, 1, -1, u64::MAX, i64::MIN, 0.5, -2.25, 1e300, 1.5e-7, 3.0, -0.0],
            "nested": {"z": [true, false, null], "a": {}, "m": [[], [{}]]},
            "": "",
        }));
        same_as_serde_json(&Value::Null);
        same_as_serde_json("a string at the top");
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Everything {
        unit: (),
        none: Option<u8>,
        some: Option<&'static str>,
        chars: Vec<char>,
        small: (i8, i16, i32, u8, u16, u32, i128, u128),
        floats: (f32, f64, f64, f64),
        bytes: &'static [u8],
        unit_variant: Kind,
        newtype_variant: Kind,
        tuple_variant: Kind,
        struct_variant: Kind,
        newtype: Meters,
        tuple_struct: Pair,
        int_keys: BTreeMap<i32, &'static str>,
        bool_keys: BTreeMap<bool, u8>,
        unit_variant_keys: BTreeMap<Unit, u8>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        skipped: Vec<u8>,
        #[serde(flatten)]
        flattened: BTreeMap<String, Value>,
    }

    #[derive(Serialize)]
    enum Kind {
        Plain,
        Wrapped(u8),
        Pair(u8, &'static str),
        Named { a: u8, b: &'static str },
    }

    #[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
    enum Unit {
        First,
        Second,
    }

    #[derive(Serialize)]
    struct Meters(f64);

    #[derive(Serialize)]
    struct Pair(u8, &'static str);

    #[test]
    fn every_serde_form_is_written_as_serde_json_writes_it() {
        let all = |unit_variant, newtype_variant, tuple_variant, struct_variant| Everything {
            unit: (),
            none: None,
            some: Some("\"quoted\""),
            chars: vec!['a', '"', '\n', 'é', '🚀'],
            small: (-8, -16, -32, 8, 16, 32, i128::MIN, u128::MAX),
            floats: (1.5, f64::NAN, f64::INFINITY, 0.1),
            bytes: b"\x00\xffab",
            unit_variant,
            newtype_variant,
            tuple_variant,
            struct_variant,
            newtype: Meters(2.5),
            tuple_struct: Pair(7, "seven"),
            int_keys: BTreeMap::from([(-1, "minus one"), (2, "two")]),
            bool_keys: BTreeMap::from([(false, 0), (true, 1)]),
            unit_variant_keys: BTreeMap::from([(Unit::First, 1), (Unit::Second, 2)]),
            skipped: Vec::new(),
            flattened: BTreeMap::from([
                ("extra".to_owned(), json!({"k": "v\u{0}"})),
                ("more".to_owned(), json!([1, "two"])),
            ]),
        };
        same_as_serde_json(&all(
            Kind::Plain,
            Kind::Wrapped(1),
            Kind::Pair(2, "b"),
            Kind::Named { a: 3, b: "c\\" },
        ));
    }

    /// What serde_json's `arbitrary_precision` numbers and `RawValue`s
    /// hand a serializer (features not on in this build): a struct named
    /// `$serde_json::private::…` of one field, its text.
    #[test]
    fn serde_jsons_special_forms_are_written_verbatim() {
        struct Special(&'static str, &'static str);
        impl Serialize for Special {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeStruct;
                let mut st = s.serialize_struct(self.0, 1)?;
                st.serialize_field(self.0, self.1)?;
                st.end()
            }
        }
        let number = Special("$serde_json::private::Number", "12.50");
        let raw = Special("$serde_json::private::RawValue", r#"{"a": [1, 2]}"#);
        assert_eq!(to_string(&[&number]).expect("written"), "[12.50]");
        assert_eq!(to_string(&raw).expect("written"), r#"{"a": [1, 2]}"#);
        // Text that needs escapes comes back whole.
        let raw = Special("$serde_json::private::RawValue", "[\"a\\\"b\\\\\",\n\u{1}]");
        assert_eq!(
            to_string(&raw).expect("written"),
            "[\"a\\\"b\\\\\",\n\u{1}]"
        );
        // Any other struct is an object.
        let plain = Special("Plain", "x");
        assert_eq!(to_string(&plain).expect("written"), r#"{"Plain":"x"}"#);
    }

    #[test]
    fn unquote_undoes_every_escape_write_str_makes() {
        let mut all: String = (0u32..0x80).filter_map(char::from_u32).collect();
        all.push_str("café 日本 🚀 \\/\"");
        for s in [all.as_str(), "", "plain", "\"", "\\", "\u{0}\u{1f}"] {
            let mut quoted = String::new();
            write_str(s, &mut quoted);
            assert_eq!(unquote(&quoted).as_deref(), Some(s), "{quoted}");
        }
        assert_eq!(unquote(r#""\/""#).as_deref(), Some("/"));
        for bad in [
            "",
            "x",
            "\"unterminated",
            r#""\q""#,
            r#""\u12""#,
            r#""\ud800""#,
        ] {
            assert_eq!(unquote(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_serde_json_refuses_are_refused() {
        let map = BTreeMap::from([(vec![1u8], 1u8)]);
        assert!(serde_json::to_string(&map).is_err());
        assert!(to_string(&map).is_err());
        let map = BTreeMap::from([(None::<u8>, 1u8)]);
        assert!(serde_json::to_string(&map).is_err());
        assert!(to_string(&map).is_err());
        let map = BTreeMap::from([(f64::NAN.to_bits(), ())]);
        same_as_serde_json(&map);
        let map = BTreeMap::from([(Some(1u8), 1u8)]);
        same_as_serde_json(&map);
        // Float keys (no `Ord`, so a hand-made map): quoted, finite only.
        struct FloatKeys(f64, f32);
        impl Serialize for FloatKeys {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeMap;
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry(&self.0, &true)?;
                m.serialize_entry(&self.1, &false)?;
                m.end()
            }
        }
        same_as_serde_json(&FloatKeys(1.5, 0.1));
        assert!(serde_json::to_string(&FloatKeys(f64::NAN, 0.1)).is_err());
        assert!(to_string(&FloatKeys(f64::NAN, 0.1)).is_err());
        assert!(to_string(&FloatKeys(1.0, f32::INFINITY)).is_err());
    }

    #[test]
    fn a_plan_with_every_field_is_written_as_serde_json_writes_it() {
        let plan: crate::Plan = serde_json::from_value(json!({
            "apply": [{"object": {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "c", "namespace": "ns"},
                                  "data": {"k": "v\n\"x\""}},
                       "precondition": null, "force": true}],
            "delete": [{"target": {"apiVersion": "v1", "kind": "Secret", "namespace": "ns", "name": "s"},
                        "uid": "u", "resourceVersion": "7"}],
            "status": {"phase": "Ready", "observedGeneration": 3},
            "primaryPatch": {"metadata": {"annotations": {"a": "b"}}},
            "events": [{"type": "Warning", "reason": "Why", "message": "what\tnow"}],
            "requeueAfterMs": 1500,
            "cleanupComplete": true,
            "gauges": [{"name": "ratio", "labels": {"le": "0.5"}, "value": 0.25}],
        }))
        .expect("a plan");
        same_as_serde_json(&plan);
        let kind_plan = crate::Plan {
            objects: vec![crate::ObjectPlan::new(
                &json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}),
                plan.clone(),
            )],
            ..crate::Plan::default()
        };
        same_as_serde_json(&kind_plan);
    }
}
