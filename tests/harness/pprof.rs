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
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
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
    #[prost(int64, tag = "5")]
    pub filename: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
}

impl Profile {
    /// A gzip'd pprof file (ddprof's `.pprof` output), decoded.
    pub fn read_gzipped(path: &Path) -> Result<Profile, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut decoded)
            .map_err(|e| format!("{}: not gzip: {e}", path.display()))?;
        <Profile as prost::Message>::decode(&decoded[..])
            .map_err(|e| format!("{}: not a pprof profile: {e}", path.display()))
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

    /// The profile's comments.
    pub fn comments(&self) -> Vec<String> {
        self.comment
            .iter()
            .map(|&index| self.string(index).to_string())
            .collect()
    }
}
