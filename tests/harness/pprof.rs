//! The messages of pprof's profile.proto the tests read, declared here
//! rather than taken from ddprof so that the tests read profiles as any
//! pprof reader would; and reading a gzip'd profile file.
use std::io::Read;
use std::path::Path;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

impl Profile {
    /// A gzip'd pprof file (ddprof's `.pprof` output), decoded.
    pub fn read_gzipped(path: &Path) -> Result<Profile, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::decode_gzipped(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Gzip'd pprof bytes, decoded.
    pub fn decode_gzipped(bytes: &[u8]) -> Result<Profile, String> {
        Self::decode(&gunzip(bytes)?)
    }

    /// Uncompressed pprof bytes, decoded.
    pub fn decode(raw: &[u8]) -> Result<Profile, String> {
        <Profile as prost::Message>::decode(raw).map_err(|e| format!("not a pprof profile: {e}"))
    }

    pub fn string(&self, index: i64) -> &str {
        self.string_table
            .get(index as usize)
            .map_or("", String::as_str)
    }

    /// Every function name the samples' stacks reach.
    pub fn function_names(&self) -> std::collections::HashSet<String> {
        self.function
            .iter()
            .map(|f| self.string(f.name).to_string())
            .collect()
    }

    /// Each sample's label keys and values (numbers as text).
    pub fn labels(&self) -> Vec<Vec<(String, String)>> {
        self.sample
            .iter()
            .map(|sample| {
                sample
                    .label
                    .iter()
                    .map(|label| {
                        let value = match label.str {
                            0 => label.num.to_string(),
                            index => self.string(index).to_string(),
                        };
                        (self.string(label.key).to_string(), value)
                    })
                    .collect()
            })
            .collect()
    }

    /// The sample types as (`type`, `unit`).
    pub fn sample_types(&self) -> Vec<(String, String)> {
        self.sample_type
            .iter()
            .map(|t| {
                (
                    self.string(t.r#type).to_string(),
                    self.string(t.unit).to_string(),
                )
            })
            .collect()
    }

    /// Each sample's function names (innermost first; inlined frames
    /// included) and values.
    pub fn stacks(&self) -> Vec<(Vec<String>, Vec<i64>)> {
        let functions: std::collections::HashMap<u64, &str> = self
            .function
            .iter()
            .map(|f| (f.id, self.string(f.name)))
            .collect();
        let locations: std::collections::HashMap<u64, &Location> =
            self.location.iter().map(|l| (l.id, l)).collect();
        self.sample
            .iter()
            .map(|sample| {
                let names = sample
                    .location_id
                    .iter()
                    .filter_map(|id| locations.get(id))
                    .flat_map(|location| location.line.iter())
                    .map(|line| {
                        functions
                            .get(&line.function_id)
                            .copied()
                            .unwrap_or("")
                            .to_string()
                    })
                    .collect();
                (names, sample.value.clone())
            })
            .collect()
    }

    /// The profile's comments.
    pub fn comments(&self) -> Vec<String> {
        self.comment
            .iter()
            .map(|&index| self.string(index).to_string())
            .collect()
    }
}

/// A sample's label `key` (of [`Profile::labels`]), if it has one.
pub fn label(labels: &[(String, String)], key: &str) -> Option<String> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, value)| value.clone())
}

/// Gzip'd bytes, inflated.
pub fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut inflated = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut inflated)
        .map_err(|e| format!("not gzip: {e}"))?;
    Ok(inflated)
}
