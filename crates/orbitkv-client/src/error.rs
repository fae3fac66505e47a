use orbitkv_proto::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("Manager unavailable: {0}")]
    Unavailable(String),
    #[error("refused by the Manager: {0}")]
    Auth(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The process answering on the socket runs as a uid this client does not
    /// trust; nothing (no token) was sent to it.
    #[error("untrusted Manager: {0}")]
    UntrustedServer(String),
    #[error("{message}")]
    Server { code: ErrorCode, message: String },
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A buffer or buffer list does not have the size its blocks need: an
    /// argument error (no Manager state changed), never truncated or padded.
    #[error("invalid argument: {what}: expected {expected}, got {actual}")]
    Size {
        what: String,
        expected: u64,
        actual: u64,
    },
    /// A segment id this client does not map (an argument error, not a
    /// protocol failure: the session stays usable).
    #[error("invalid argument: no arena segment {segment} (this client maps {known:?})")]
    UnknownSegment { segment: u32, known: Vec<u32> },
    #[error("client is closed")]
    Closed,
    #[error("a copy thread panicked; the copy is incomplete")]
    CopyPanicked,
    #[error("arena access: {0}")]
    Arena(#[from] orbitkv_shm::ShmError),
}

impl ClientError {
    /// Stable name of the failure class (used by the Python exceptions).
    pub fn code_name(&self) -> &'static str {
        match self {
            ClientError::Unavailable(_) => "unavailable",
            ClientError::Auth(_) => "auth",
            ClientError::UntrustedServer(_) => "untrusted_server",
            ClientError::Protocol(_) => "protocol",
            ClientError::Invalid(_) => "invalid_argument",
            ClientError::Size { .. } => "size_mismatch",
            ClientError::UnknownSegment { .. } => "unknown_segment",
            ClientError::Closed => "closed",
            ClientError::Arena(_) => "arena",
            ClientError::CopyPanicked => "copy_panicked",
            ClientError::Server { code, .. } => match code {
                ErrorCode::BadFrame => "bad_frame",
                ErrorCode::Version => "version",
                ErrorCode::Auth => "auth",
                ErrorCode::UnknownNamespace => "unknown_namespace",
                ErrorCode::Busy => "busy",
                ErrorCode::NotFound => "not_found",
                ErrorCode::NotOwner => "not_owner",
                ErrorCode::RestoreFailed => "restore_failed",
                ErrorCode::InvalidArgument => "invalid_argument",
                ErrorCode::Internal => "internal",
                ErrorCode::FaultInjectionDisabled => "fault_injection_disabled",
                ErrorCode::TooLarge => "too_large",
                ErrorCode::SessionClosed => "session_closed",
                ErrorCode::SaveFailed => "save_failed",
            },
        }
    }
}
