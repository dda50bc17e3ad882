//! The layer's response body, and the bodies of its own answers (429, 400).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};

use super::refund::OnEnd;

pin_project_lite::pin_project! {
    /// A response body: the inner service's, or the layer's own answer (a
    /// rejection, a missing key) in one piece.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        end: End,
    }
}

/// What runs once when the body ends: its last frame was read, or it was
/// dropped before (the client went away). A reservation settles there, so
/// a streamed response is charged what it streamed.
#[derive(Default)]
struct End(Option<OnEnd>);

impl End {
    fn run(&mut self) {
        if let Some(end) = self.0.take() {
            end();
        }
    }
}

impl Drop for End {
    fn drop(&mut self) {
        self.run();
    }
}

pin_project_lite::pin_project! {
    #[project = KindProjection]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
            end: End::default(),
        }
    }

    /// The inner service's body, which runs `end` (when there is one)
    /// once it ends.
    pub(crate) fn inner_then(body: B, end: Option<OnEnd>) -> Self {
        Self {
            kind: Kind::Inner { body },
            end: End(end),
        }
    }

    /// The layer's own body.
    pub(crate) fn full(data: Bytes) -> Self {
        let data = (!data.is_empty()).then_some(data);
        Self {
            kind: Kind::Full { data },
            end: End::default(),
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f.debug_tuple("ResponseBody::Full").field(data).finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProjection::Inner { body } => {
                let frame = body.poll_frame(cx);
                if let Poll::Ready(None) = frame {
                    this.end.run();
                }
                frame
            }
            KindProjection::Full { data } => {
                Poll::Ready(data.take().map(|data| Ok(Frame::data(data.into()))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// How the layer writes the bodies of its own answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Format {
    /// `text/plain`: one sentence.
    #[default]
    Text,
    /// RFC 9457 `application/problem+json`.
    Problem,
}

/// The layer's answer with `status`, saying `detail`; a rejection's
/// problem document also carries `retry_after` (seconds).
pub(crate) fn answer(
    format: Format,
    status: StatusCode,
    detail: &str,
    retry_after: Option<u64>,
) -> Response<Bytes> {
    let title = status.canonical_reason().unwrap_or("Error");
    let (content_type, body) = match format {
        Format::Text => ("text/plain; charset=utf-8", format!("{title}: {detail}\n")),
        Format::Problem => {
            let mut json = format!(
                "{{\"type\":\"about:blank\",\"title\":{},\"status\":{},\"detail\":{}",
                json_string(title),
                status.as_u16(),
                json_string(detail)
            );
            if let Some(seconds) = retry_after {
                json.push_str(&format!(",\"retry_after\":{seconds}"));
            }
            json.push('}');
            ("application/problem+json", json)
        }
    };
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// `text` as a JSON string.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_documents_are_json() {
        let response = answer(
            Format::Problem,
            StatusCode::TOO_MANY_REQUESTS,
            "retry \"soon\"",
            Some(2),
        );
        assert_eq!(
            response.body(),
            &Bytes::from_static(
                br#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"retry \"soon\"","retry_after":2}"#
            )
        );
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
    }
}
