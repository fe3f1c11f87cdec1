//! Sends one profile to an agent URL through libdatadog's exporter, as
//! Datadog's libraries send them; prints the HTTP status.
//!
//! Usage: reference-exporter URL START_NS END_NS PROFILE CODE_PROVENANCE
//! INTERNAL_JSON INFO_JSON VERSION [KEY:VALUE ...]
//! (times in nanoseconds since the epoch; PROFILE the pprof bytes as
//! ddprof sent them; CODE_PROVENANCE the JSON file; the tags last).
use std::time::{Duration, UNIX_EPOCH};

use libdd_profiling::exporter::{self, File, ProfileExporter, Tag};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, start, end, profile, provenance, internal, info, version, tags @ ..] = &args[..]
    else {
        eprintln!(
            "usage: reference-exporter URL START_NS END_NS PROFILE CODE_PROVENANCE \
             INTERNAL_JSON INFO_JSON VERSION [KEY:VALUE ...]"
        );
        std::process::exit(2);
    };
    let at = |nanos: &str| UNIX_EPOCH + Duration::from_nanos(nanos.parse().expect("nanoseconds"));
    let tags: Vec<Tag> = tags
        .iter()
        .map(|tag| {
            let (key, value) = tag.split_once(':').expect("KEY:VALUE");
            Tag::new(key, value).expect("a tag libdatadog takes")
        })
        .collect();
    let endpoint = exporter::config::agent(url.parse().expect("a URL")).expect("an agent endpoint");
    let reference = ProfileExporter::new("ddprof", version.clone(), "native", Some(tags), endpoint)
        .expect("libdatadog's exporter");
    let encoded = libdd_profiling::internal::EncodedProfile {
        start: at(start),
        end: at(end),
        buffer: std::fs::read(profile).expect("the profile"),
        endpoints_stats: Default::default(),
    };
    let code_provenance = std::fs::read(provenance).expect("code-provenance.json");
    let files = [File {
        name: "code-provenance.json",
        bytes: &code_provenance,
    }];
    let no_files: &[File] = &[];
    let request = reference
        .build(
            encoded,
            &files,
            no_files,
            None,
            Some(serde_json::from_str(internal).expect("internal JSON")),
            Some(serde_json::from_str(info).expect("info JSON")),
        )
        .expect("libdatadog builds the request");
    let response = reference.send(request, None).expect("libdatadog sends it");
    println!("{}", response.status().as_u16());
}
