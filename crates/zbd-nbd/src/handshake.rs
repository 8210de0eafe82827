//! Fixed newstyle negotiation: greeting, client flags, then options until the client picks the
//! export (GO or EXPORT_NAME) or leaves (ABORT, disconnect).

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::export::{BlockSizes, Directory, Export};
use crate::limits;
use crate::wire::{self, PayloadReader};

/// Id we give `base:allocation` when the client selects it.
pub(crate) const BASE_ALLOCATION_ID: u32 = 1;

/// What the handshake settled for the transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Session {
    pub structured: bool,
    /// Context id of `base:allocation` if selected; BLOCK_STATUS is only valid with it.
    pub allocation_context: Option<u32>,
    pub transmission_flags: u16,
    /// Export size told to the client when it chose the export: requests are checked against
    /// it for the whole connection, even if the export grows meanwhile (NBD has no resize
    /// notice; a client that reconnects learns the new size).
    pub size: u64,
}

/// What the handshake needs to know about the export being offered.
pub(crate) struct Offer<'a> {
    pub export: &'a dyn Export,
    pub name: &'a str,
    /// The other exports, by name.
    pub directory: Option<&'a dyn Directory>,
    pub description: Option<&'a str>,
    pub payload_bytes_max: u32,
    pub shutting_down: &'a AtomicBool,
}

impl Offer<'_> {
    /// The export the client names: the default one by its name or the empty name
    /// (`Some(None)`), another one of the directory (`Some(Some(_))`), or none.
    fn choose(&self, requested: &str) -> Option<Option<Arc<dyn Export>>> {
        if requested.is_empty() || requested == self.name {
            return Some(None);
        }
        self.directory?.find(requested).map(Some)
    }

    fn block_sizes(&self) -> BlockSizes {
        let mut sizes = self.export.block_sizes();
        sizes.maximum = sizes.maximum.min(self.payload_bytes_max).max(sizes.minimum);
        sizes
    }
}

/// Why a handshake ended without a session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("client aborted the handshake")]
    Aborted,
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

fn violation(message: impl Into<String>) -> HandshakeError {
    HandshakeError::Protocol(message.into())
}

/// Transmission flags for this export; DF only makes sense with structured replies.
pub(crate) fn transmission_flags(export: &dyn Export, structured: bool) -> u16 {
    let mut flags = wire::FLAG_HAS_FLAGS | wire::FLAG_SEND_FLUSH | wire::FLAG_CAN_MULTI_CONN;
    if export.is_read_only() {
        flags |= wire::FLAG_READ_ONLY;
    } else {
        flags |= wire::FLAG_SEND_FUA | wire::FLAG_SEND_TRIM | wire::FLAG_SEND_WRITE_ZEROES;
    }
    if structured {
        flags |= wire::FLAG_SEND_DF;
    }
    flags
}

fn read_u32(reader: &mut impl Read) -> io::Result<u32> {
    let mut raw = [0u8; 4];
    reader.read_exact(&mut raw)?;
    Ok(u32::from_be_bytes(raw))
}

fn write_option_reply(
    writer: &mut impl Write,
    option: u32,
    reply: u32,
    data: &[u8],
) -> io::Result<()> {
    let length = u32::try_from(data.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "option reply too long"))?;
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&wire::OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(data);
    writer.write_all(&out)?;
    writer.flush()
}

/// Sends an error reply with a human-readable message and logs it.
fn reject_option(
    writer: &mut impl Write,
    option: u32,
    reply: u32,
    message: &str,
) -> io::Result<()> {
    tracing::warn!(
        option = wire::option_name(option),
        code = option,
        "rejected option: {message}"
    );
    write_option_reply(writer, option, reply, message.as_bytes())
}

/// Runs the handshake. `Ok(session)` means the transmission phase starts now.
/// Returns the session and the export chosen when it is not the default one.
pub(crate) fn negotiate(
    reader: &mut impl Read,
    writer: &mut impl Write,
    offer: &Offer<'_>,
) -> Result<(Session, Option<Arc<dyn Export>>), HandshakeError> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&wire::NBDMAGIC.to_be_bytes());
    greeting.extend_from_slice(&wire::IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(wire::FLAG_FIXED_NEWSTYLE | wire::FLAG_NO_ZEROES).to_be_bytes());
    writer.write_all(&greeting)?;
    writer.flush()?;

    let client_flags = read_u32(reader)?;
    let known = wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES;
    if client_flags & !known != 0 {
        return Err(violation(format!("unknown client flags {client_flags:#x}")));
    }
    let no_zeroes = client_flags & wire::FLAG_C_NO_ZEROES != 0;

    let mut state = OptionState {
        structured: false,
        allocation_context: None,
    };
    for _ in 0..limits::OPTIONS_PER_CONNECTION_MAX {
        let mut header = [0u8; wire::OPTION_HEADER_BYTES];
        reader.read_exact(&mut header)?;
        let mut fields = PayloadReader::new(&header);
        let magic = fields.u64().unwrap_or(0);
        let option = fields.u32().unwrap_or(0);
        let length = fields.u32().unwrap_or(0);
        if magic != wire::IHAVEOPT {
            return Err(violation(format!("bad option magic {magic:#x}")));
        }
        if length > limits::OPTION_BYTES_MAX {
            return Err(violation(format!(
                "option {} ({option}) has {length} bytes of data, more than {}",
                wire::option_name(option),
                limits::OPTION_BYTES_MAX
            )));
        }
        let mut data = vec![0u8; length as usize];
        reader.read_exact(&mut data)?;

        if offer.shutting_down.load(Ordering::SeqCst) && option != wire::OPT_ABORT {
            reject_option(
                writer,
                option,
                wire::REP_ERR_SHUTDOWN,
                "server is shutting down",
            )?;
            continue;
        }
        match option {
            wire::OPT_EXPORT_NAME => {
                let name = std::str::from_utf8(&data).unwrap_or("\u{fffd}");
                let Some(chosen) = offer.choose(name) else {
                    // This option cannot carry an error: the protocol says to drop the session.
                    return Err(violation(format!(
                        "EXPORT_NAME asks for unknown export {name:?}"
                    )));
                };
                let export = chosen.as_deref().unwrap_or(offer.export);
                let flags = transmission_flags(export, state.structured);
                let size = export.size();
                let mut reply = Vec::with_capacity(10 + wire::EXPORT_NAME_PADDING_BYTES);
                reply.extend_from_slice(&size.to_be_bytes());
                reply.extend_from_slice(&flags.to_be_bytes());
                if !no_zeroes {
                    reply.extend_from_slice(&[0u8; wire::EXPORT_NAME_PADDING_BYTES]);
                }
                writer.write_all(&reply)?;
                writer.flush()?;
                return Ok((state.session(flags, size), chosen));
            }
            wire::OPT_ABORT => {
                // The client may already have closed; a failed ACK is no error.
                let _ = write_option_reply(writer, option, wire::REP_ACK, &[]);
                return Err(HandshakeError::Aborted);
            }
            wire::OPT_GO | wire::OPT_INFO => {
                if let Some((size, flags, chosen)) =
                    answer_info(writer, option, &data, offer, &state)?
                {
                    return Ok((state.session(flags, size), chosen));
                }
            }
            wire::OPT_LIST => answer_list(writer, &data, offer)?,
            wire::OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    reject_option(writer, option, wire::REP_ERR_INVALID, "takes no data")?;
                } else {
                    state.structured = true;
                    write_option_reply(writer, option, wire::REP_ACK, &[])?;
                }
            }
            wire::OPT_LIST_META_CONTEXT | wire::OPT_SET_META_CONTEXT => {
                answer_meta_context(writer, option, &data, offer, &mut state)?
            }
            _ => reject_option(
                writer,
                option,
                wire::REP_ERR_UNSUP,
                &format!(
                    "option {} ({option}) not supported",
                    wire::option_name(option)
                ),
            )?,
        }
    }
    Err(violation(format!(
        "more than {} options without choosing an export",
        limits::OPTIONS_PER_CONNECTION_MAX
    )))
}

struct OptionState {
    structured: bool,
    allocation_context: Option<u32>,
}

impl OptionState {
    fn session(&self, transmission_flags: u16, size: u64) -> Session {
        Session {
            structured: self.structured,
            allocation_context: self.allocation_context,
            transmission_flags,
            size,
        }
    }
}

/// NBD_OPT_LIST: the default export, then the directory's, then ACK.
fn answer_list(writer: &mut impl Write, data: &[u8], offer: &Offer<'_>) -> io::Result<()> {
    if !data.is_empty() {
        return reject_option(
            writer,
            wire::OPT_LIST,
            wire::REP_ERR_INVALID,
            "takes no data",
        );
    }
    let mut server = Vec::new();
    server.extend_from_slice(&(offer.name.len() as u32).to_be_bytes());
    server.extend_from_slice(offer.name.as_bytes());
    if let Some(description) = offer.description {
        server.extend_from_slice(description.as_bytes());
    }
    write_option_reply(writer, wire::OPT_LIST, wire::REP_SERVER, &server)?;
    for name in offer.directory.map(|d| d.names()).unwrap_or_default() {
        let mut server = (name.len() as u32).to_be_bytes().to_vec();
        server.extend_from_slice(name.as_bytes());
        write_option_reply(writer, wire::OPT_LIST, wire::REP_SERVER, &server)?;
    }
    write_option_reply(writer, wire::OPT_LIST, wire::REP_ACK, &[])
}

/// What GO settled: the size told, the transmission flags and the export when not the default.
type Chosen = (u64, u16, Option<Arc<dyn Export>>);

/// NBD_OPT_INFO / NBD_OPT_GO. Returns what GO settled when it succeeded (transmission starts).
fn answer_info(
    writer: &mut impl Write,
    option: u32,
    data: &[u8],
    offer: &Offer<'_>,
    state: &OptionState,
) -> io::Result<Option<Chosen>> {
    let mut payload = PayloadReader::new(data);
    let Some(name) = payload.string32(limits::STRING_BYTES_MAX) else {
        reject_option(
            writer,
            option,
            wire::REP_ERR_INVALID,
            "malformed export name",
        )?;
        return Ok(None);
    };
    let name = name.to_string();
    let Some(count) = payload.u16() else {
        reject_option(
            writer,
            option,
            wire::REP_ERR_INVALID,
            "missing info request count",
        )?;
        return Ok(None);
    };
    let mut requests = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        match payload.u16() {
            Some(kind) => requests.push(kind),
            None => {
                reject_option(
                    writer,
                    option,
                    wire::REP_ERR_INVALID,
                    "truncated info requests",
                )?;
                return Ok(None);
            }
        }
    }
    if payload.remaining() != 0 {
        reject_option(writer, option, wire::REP_ERR_INVALID, "trailing bytes")?;
        return Ok(None);
    }
    let Some(chosen) = offer.choose(&name) else {
        let message = format!("no export named {name:?}");
        reject_option(writer, option, wire::REP_ERR_UNKNOWN, &message)?;
        return Ok(None);
    };
    let export = chosen.as_deref().unwrap_or(offer.export);

    let flags = transmission_flags(export, state.structured);
    // Read once: the size told is the size the connection keeps (`Session::size`).
    let size = export.size();
    let mut export = Vec::with_capacity(12);
    export.extend_from_slice(&wire::INFO_EXPORT.to_be_bytes());
    export.extend_from_slice(&size.to_be_bytes());
    export.extend_from_slice(&flags.to_be_bytes());
    write_option_reply(writer, option, wire::REP_INFO, &export)?;

    // Block sizes are always worth telling (qemu and the kernel use them for alignment).
    let sizes = offer.block_sizes();
    let mut block = Vec::with_capacity(14);
    block.extend_from_slice(&wire::INFO_BLOCK_SIZE.to_be_bytes());
    block.extend_from_slice(&sizes.minimum.to_be_bytes());
    block.extend_from_slice(&sizes.preferred.to_be_bytes());
    block.extend_from_slice(&sizes.maximum.to_be_bytes());
    write_option_reply(writer, option, wire::REP_INFO, &block)?;

    if requests.contains(&wire::INFO_NAME) {
        let mut info = wire::INFO_NAME.to_be_bytes().to_vec();
        let told = if chosen.is_some() { &name } else { offer.name };
        info.extend_from_slice(told.as_bytes());
        write_option_reply(writer, option, wire::REP_INFO, &info)?;
    }
    if let (true, Some(description)) = (
        requests.contains(&wire::INFO_DESCRIPTION),
        offer.description,
    ) {
        let mut info = wire::INFO_DESCRIPTION.to_be_bytes().to_vec();
        info.extend_from_slice(description.as_bytes());
        write_option_reply(writer, option, wire::REP_INFO, &info)?;
    }
    write_option_reply(writer, option, wire::REP_ACK, &[])?;
    Ok((option == wire::OPT_GO).then_some((size, flags, chosen)))
}

/// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT. We know one context,
/// `base:allocation`; LIST with no query, or with the query `base:`, lists it.
fn answer_meta_context(
    writer: &mut impl Write,
    option: u32,
    data: &[u8],
    offer: &Offer<'_>,
    state: &mut OptionState,
) -> io::Result<()> {
    if !state.structured {
        return reject_option(
            writer,
            option,
            wire::REP_ERR_INVALID,
            "negotiate structured replies first",
        );
    }
    let mut payload = PayloadReader::new(data);
    let Some(name) = payload.string32(limits::STRING_BYTES_MAX) else {
        return reject_option(
            writer,
            option,
            wire::REP_ERR_INVALID,
            "malformed export name",
        );
    };
    let name = name.to_string();
    let Some(count) = payload.u32() else {
        return reject_option(writer, option, wire::REP_ERR_INVALID, "missing query count");
    };
    let mut queries = Vec::new();
    for _ in 0..count {
        match payload.string32(limits::STRING_BYTES_MAX) {
            Some(query) => queries.push(query),
            None => return reject_option(writer, option, wire::REP_ERR_INVALID, "malformed query"),
        }
    }
    if payload.remaining() != 0 {
        return reject_option(writer, option, wire::REP_ERR_INVALID, "trailing bytes");
    }
    if offer.choose(&name).is_none() {
        return reject_option(
            writer,
            option,
            wire::REP_ERR_UNKNOWN,
            &format!("no export named {name:?}"),
        );
    }
    let listing = option == wire::OPT_LIST_META_CONTEXT;
    let selects_allocation = if listing {
        queries.is_empty()
            || queries
                .iter()
                .any(|q| *q == wire::CONTEXT_BASE_ALLOCATION || *q == wire::CONTEXT_BASE_NAMESPACE)
    } else {
        queries.contains(&wire::CONTEXT_BASE_ALLOCATION)
    };
    if !listing {
        // SET replaces the previous selection, even with nothing.
        state.allocation_context = selects_allocation.then_some(BASE_ALLOCATION_ID);
    }
    if selects_allocation {
        let id = if listing { 0 } else { BASE_ALLOCATION_ID };
        let mut context = id.to_be_bytes().to_vec();
        context.extend_from_slice(wire::CONTEXT_BASE_ALLOCATION.as_bytes());
        write_option_reply(writer, option, wire::REP_META_CONTEXT, &context)?;
    }
    write_option_reply(writer, option, wire::REP_ACK, &[])
}
