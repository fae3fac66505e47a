//! The exceptions `orbitkv._native` raises, and [`to_py`]: the one mapping
//! from a [`ClientError`] to the Python exception a caller sees.

use orbitkv_client::ClientError;
use orbitkv_proto::ErrorCode;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _native,
    OrbitKVError,
    PyException,
    "Base error of the native client."
);
create_exception!(
    _native,
    ManagerUnavailable,
    OrbitKVError,
    "No Manager on the socket, or the connection broke."
);
create_exception!(
    _native,
    AuthError,
    OrbitKVError,
    "The Manager refused this peer, or the peer is not a trusted Manager."
);
create_exception!(
    _native,
    ProtocolError,
    OrbitKVError,
    "Malformed or unexpected frame."
);
create_exception!(
    _native,
    Busy,
    OrbitKVError,
    "Refused because owners are still live."
);
create_exception!(
    _native,
    SaveFailed,
    OrbitKVError,
    "A save failed; nothing of it became visible."
);
create_exception!(
    _native,
    RestoreFailed,
    OrbitKVError,
    "The Manager could not stage the leased blocks."
);

pub(crate) fn to_py(e: ClientError) -> PyErr {
    let name = e.code_name();
    let msg = format!("{e} [{name}]");
    match &e {
        ClientError::Unavailable(_) | ClientError::Closed => ManagerUnavailable::new_err(msg),
        ClientError::Auth(_) | ClientError::UntrustedServer(_) => AuthError::new_err(msg),
        ClientError::Protocol(_) => ProtocolError::new_err(msg),
        ClientError::Invalid(_) | ClientError::Size { .. } | ClientError::UnknownSegment { .. } => {
            PyValueError::new_err(msg)
        }
        ClientError::Server { code, .. } => match code {
            ErrorCode::Busy => Busy::new_err(msg),
            ErrorCode::RestoreFailed => RestoreFailed::new_err(msg),
            ErrorCode::SaveFailed => SaveFailed::new_err(msg),
            ErrorCode::Auth => AuthError::new_err(msg),
            ErrorCode::InvalidArgument => PyValueError::new_err(msg),
            _ => OrbitKVError::new_err(msg),
        },
        _ => OrbitKVError::new_err(msg),
    }
}
