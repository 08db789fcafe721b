//! The bodies that are `inputs` and TEI's three embedding options and nothing else: TEI 1.9.3's
//! `/embed_all` and `/embed_sparse` take the same fields and differ only in the [`Task`] their
//! inputs are batched under. One macro declares both, so that their fields, parsing and checks
//! are written once while each stays its own type (its own name in the OpenAPI document, as
//! TEI's `EmbedAllRequest` and `EmbedSparseRequest` are).
//!
//! [`Task`]: crate::Task

/// `inputs_request! { /// docs  Name("/route", Task::X, "why normalize is off") }` declares
/// `pub struct Name` (`inputs`, `truncate`, `truncation_direction`, `prompt_name`, with the
/// docs given) and its `from_slice`, `validate` and `into_parts` (inputs batched under the task
/// given, `normalize` off).
macro_rules! inputs_request {
    ($(#[$meta:meta])* $name:ident($route:literal, $task:expr, $parts:literal)) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub struct $name {
            /// One input or an array of inputs; an input is a text or an array of token ids.
            pub inputs: crate::request::Inputs,
            /// Truncate inputs longer than the model's maximum instead of failing. Absent: the
            /// upstream's default (TEI's `--auto-truncate`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub truncate: Option<bool>,
            /// Which end to cut when truncating (default `Right`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub truncation_direction: Option<crate::TruncationDirection>,
            /// Name of a prompt from the model's sentence-transformers config to prepend.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub prompt_name: Option<String>,
        }

        impl $name {
            #[doc = concat!("Parses a `", $route, "` body, with the statuses of ",
                "[`crate::EmbedRequest::from_slice`] (400 for a body that is not JSON, 422 naming ",
                "the field for JSON of the wrong shape).\n\n# Errors\n",
                "[`EmbedError::InvalidJson`](crate::EmbedError::InvalidJson) or ",
                "[`EmbedError::Validation`](crate::EmbedError::Validation).")]
            pub fn from_slice(body: &[u8]) -> Result<$name, crate::EmbedError> {
                crate::request::parse_object(body, "{\"inputs\": \"text\"}")
            }

            /// Checks TEI 1.9.3's limits of `inputs` (`Inputs::validate`: 400 for none or an
            /// empty one, 422 for more than `max_inputs`).
            ///
            /// # Errors
            /// [`EmbedError::Empty`](crate::EmbedError::Empty) or
            /// [`EmbedError::Validation`](crate::EmbedError::Validation).
            pub fn validate(&self, max_inputs: usize) -> Result<(), crate::EmbedError> {
                self.inputs.validate(max_inputs)
            }

            #[doc = concat!("The request's inputs and their batching key ([`", stringify!($task),
                "`] with its `truncate`, `truncation_direction` and `prompt_name`; ", $parts, ").")]
            pub fn into_parts(self) -> (Vec<crate::Input>, crate::EmbedOptions) {
                let options = crate::EmbedOptions {
                    normalize: false,
                    truncate: self.truncate,
                    truncation_direction: self.truncation_direction,
                    prompt_name: self.prompt_name,
                    dimensions: None,
                    task: $task,
                };
                (self.inputs.into_vec(), options)
            }
        }
    };
}

pub(crate) use inputs_request;
