//! Just enough of the pprof format (gzipped protobuf, `profile.proto`) to
//! read a profile's samples: each sample's values by sample type and its
//! stack's function names, leaf first. For checks of profiles that come
//! from where no `go tool pprof` runs (the arm64 guest).
use std::collections::HashMap;
use std::io::Read;

use anyhow::{bail, Context, Result};

/// One sample: its values (one per sample type) and function names, leaf
/// first (inlined frames of a location innermost first).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sample {
    pub values: Vec<i64>,
    pub functions: Vec<String>,
}

/// A profile's sample types (`type/unit`) and samples.
#[derive(Debug, Default)]
pub struct Profile {
    pub sample_types: Vec<String>,
    pub samples: Vec<Sample>,
}

impl Profile {
    /// The index of the sample type named `name` (`alloc-samples`).
    pub fn sample_type(&self, name: &str) -> Option<usize> {
        self.sample_types
            .iter()
            .position(|kind| kind.split('/').next() == Some(name))
    }
}

/// A protobuf message's fields: `(number, value)`, where a
/// length-delimited value is its bytes and a varint its number.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).context("truncated varint")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    bail!("varint longer than 10 bytes")
}

fn fields(message: &[u8]) -> Result<Vec<(u64, Field<'_>)>> {
    let mut fields = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let key = varint(message, &mut at)?;
        let field = match key & 7 {
            0 => Field::Varint(varint(message, &mut at)?),
            1 => {
                at += 8;
                continue;
            }
            2 => {
                let len = usize::try_from(varint(message, &mut at)?)?;
                let end = at.checked_add(len).filter(|&end| end <= message.len());
                let end = end.context("length-delimited field past the message's end")?;
                let bytes = &message[at..end];
                at = end;
                Field::Bytes(bytes)
            }
            5 => {
                at += 4;
                continue;
            }
            wire => bail!("unknown wire type {wire}"),
        };
        fields.push((key >> 3, field));
    }
    Ok(fields)
}

/// A repeated integer field, packed or not.
fn integers(field: &Field<'_>, out: &mut Vec<u64>) -> Result<()> {
    match field {
        Field::Varint(value) => out.push(*value),
        Field::Bytes(packed) => {
            let mut at = 0;
            while at < packed.len() {
                out.push(varint(packed, &mut at)?);
            }
        }
    }
    Ok(())
}

fn varint_field(fields: &[(u64, Field<'_>)], number: u64) -> u64 {
    fields
        .iter()
        .find_map(|(n, field)| match field {
            Field::Varint(value) if *n == number => Some(*value),
            _ => None,
        })
        .unwrap_or(0)
}

/// Reads a gzipped (or plain) pprof profile.
pub fn parse(file: &[u8]) -> Result<Profile> {
    let mut bytes = Vec::new();
    if file.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(file)
            .read_to_end(&mut bytes)
            .context("not a gzip stream")?;
    } else {
        bytes = file.to_vec();
    }
    let top = fields(&bytes)?;
    let strings: Vec<String> = top
        .iter()
        .filter_map(|(n, field)| match field {
            Field::Bytes(text) if *n == 6 => Some(String::from_utf8_lossy(text).into_owned()),
            _ => None,
        })
        .collect();
    let string = |index: u64| strings.get(index as usize).cloned().unwrap_or_default();
    let mut sample_types = Vec::new();
    let mut functions = HashMap::new();
    let mut locations: HashMap<u64, Vec<u64>> = HashMap::new();
    for (number, field) in &top {
        // Sample types, locations and functions (samples below; strings
        // above are not messages).
        let (1 | 4 | 5, Field::Bytes(message)) = (number, field) else {
            continue;
        };
        let inner = fields(message)?;
        match number {
            1 => sample_types.push(format!(
                "{}/{}",
                string(varint_field(&inner, 1)),
                string(varint_field(&inner, 2))
            )),
            4 => {
                let mut lines = Vec::new();
                for (n, line) in &inner {
                    if let (4, Field::Bytes(line)) = (n, line) {
                        lines.push(varint_field(&fields(line)?, 1));
                    }
                }
                locations.insert(varint_field(&inner, 1), lines);
            }
            5 => {
                functions.insert(varint_field(&inner, 1), string(varint_field(&inner, 2)));
            }
            _ => {}
        }
    }
    let mut samples = Vec::new();
    for (number, field) in &top {
        let (2, Field::Bytes(message)) = (number, field) else {
            continue;
        };
        let (mut location_ids, mut values) = (Vec::new(), Vec::new());
        for (n, field) in fields(message)? {
            match n {
                1 => integers(&field, &mut location_ids)?,
                2 => integers(&field, &mut values)?,
                _ => {}
            }
        }
        let functions = location_ids
            .iter()
            .flat_map(|id| locations.get(id).into_iter().flatten())
            .map(|function| functions.get(function).cloned().unwrap_or_default())
            .collect();
        samples.push(Sample {
            values: values.into_iter().map(|value| value as i64).collect(),
            functions,
        });
    }
    Ok(Profile {
        sample_types,
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protobuf field: key, then a varint or length-delimited bytes.
    fn field(number: u64, payload: &[u8], delimited: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let put = |out: &mut Vec<u8>, mut value: u64| loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        };
        if delimited {
            put(&mut out, number << 3 | 2);
            put(&mut out, payload.len() as u64);
            out.extend_from_slice(payload);
        } else {
            put(&mut out, number << 3);
            out.extend_from_slice(payload);
        }
        out
    }

    #[test]
    fn reads_types_samples_and_their_functions() {
        let mut profile = Vec::new();
        // string_table: "", "alloc-samples", "count", "main", "alloc_small".
        for text in ["", "alloc-samples", "count", "main", "alloc_small"] {
            profile.extend(field(6, text.as_bytes(), true));
        }
        // sample_type { type: 1, unit: 2 }
        profile.extend(field(1, &[8, 1, 16, 2], true));
        // function { id: 1, name: 3 }, { id: 2, name: 4 }
        profile.extend(field(5, &[8, 1, 16, 3], true));
        profile.extend(field(5, &[8, 2, 16, 4], true));
        // location { id: 10, line { function_id: 2 } }, { id: 11, line { function_id: 1 } }
        profile.extend(field(4, &[8, 10, 34, 2, 8, 2], true));
        profile.extend(field(4, &[8, 11, 34, 2, 8, 1], true));
        // sample { location_id: [10, 11] (packed), value: [7] }
        profile.extend(field(2, &[10, 2, 10, 11, 16, 7], true));
        let parsed = parse(&profile).unwrap();
        assert_eq!(parsed.sample_types, ["alloc-samples/count"]);
        assert_eq!(parsed.sample_type("alloc-samples"), Some(0));
        assert_eq!(
            parsed.samples,
            [Sample {
                values: vec![7],
                functions: vec!["alloc_small".into(), "main".into()],
            }]
        );
        assert!(parse(&[0x0a, 0x05, 1]).is_err());
    }
}
