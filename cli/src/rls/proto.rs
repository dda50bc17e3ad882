//! The messages of `envoy.service.ratelimit.v3.RateLimitService`, declared
//! by hand from Envoy's `rls.proto` and the protos it imports, with the
//! fields the service reads or writes.
//!
//! Declared rather than generated: the `envoy-types` crate compiles 16 MB of
//! every Envoy API, and compiling the protos at build time needs `protoc`
//! on the machine. A field left out here is one this service neither reads
//! nor sends; protobuf skips it when decoding, so a client that sends it
//! (a descriptor's `x_ratelimit_option`) is answered all the same.
//!
//! Tags and enum values are the protos' own (envoy `api/envoy/service/
//! ratelimit/v3/rls.proto`, `extensions/common/ratelimit/v3/ratelimit.proto`,
//! `config/core/v3/base.proto`); the tests' client declares its messages
//! apart from these, so a wrong tag here fails them.

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The configuration's domain the descriptors are looked up in.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// What to limit on: all of them, all or nothing.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// The request's cost in every descriptor without one of its own; 0
    /// means 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The key/value pairs, from the most general to the most specific.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit given by the request itself, which this service does not
    /// take (see the module's docs on `limit`).
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// This descriptor's own cost, over the request's `hits_addend`.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    /// The key (`remote_address`, `header_match`, ...).
    #[prost(string, tag = "1")]
    pub key: String,
    /// The request's value for it.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`, the same values as [`Unit`].
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct UInt64Value {
    /// The value.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ProtoDuration {
    /// Whole seconds.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// The rest, in nanoseconds (0 to 999,999,999).
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl From<std::time::Duration> for ProtoDuration {
    fn from(duration: std::time::Duration) -> Self {
        Self {
            // A `Duration`'s seconds past i64::MAX are 292 billion years.
            seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
            // Below a billion: fits.
            nanos: duration.subsec_nanos() as i32,
        }
    }
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderValue {
    /// The header's name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// OK when every descriptor is, OVER_LIMIT when one is not.
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    /// One per descriptor of the request, in its order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers for Envoy to add to its response to the client.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
}

/// `RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    /// Not known.
    Unknown = 0,
    /// Within the limit.
    Ok = 1,
    /// Over it.
    OverLimit = 2,
}

/// `RateLimitResponse.RateLimit.Unit` (and `envoy.type.v3.RateLimitUnit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    /// Not known: what a limit given as this crate's rules answers with.
    Unknown = 0,
    /// A second.
    Second = 1,
    /// A minute.
    Minute = 2,
    /// An hour.
    Hour = 3,
    /// A day.
    Day = 4,
    /// 30 days.
    Month = 5,
    /// 365 days.
    Year = 6,
    /// 7 days (added after the others, hence out of order).
    Week = 7,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    /// The limit's name (`name:` in the file), or its id.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit.
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// This descriptor's answer.
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    /// The limit that applied, none when no limit did.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// What is left of it.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// Until the limit has room again (a refusal), or is whole again.
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<ProtoDuration>,
}
