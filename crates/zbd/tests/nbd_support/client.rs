//! A minimal blocking NBD client (fixed newstyle, NBD_OPT_GO, simple replies) for tests that
//! need to know exactly which writes and flushes were acknowledged.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const FLAG_FUA: u16 = 1;

pub struct Client {
    stream: UnixStream,
    pub size: u64,
    next_handle: u64,
}

fn protocol(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl Client {
    pub fn connect(socket: &Path) -> io::Result<Client> {
        let mut stream = UnixStream::connect(socket)?;
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting)?;
        if greeting[0..8] != NBDMAGIC.to_be_bytes() || greeting[8..16] != IHAVEOPT.to_be_bytes() {
            return Err(protocol("bad greeting".into()));
        }
        stream.write_all(&3u32.to_be_bytes())?; // FIXED_NEWSTYLE | NO_ZEROES
        let mut go = IHAVEOPT.to_be_bytes().to_vec();
        go.extend_from_slice(&OPT_GO.to_be_bytes());
        go.extend_from_slice(&6u32.to_be_bytes());
        go.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // empty name, no info requests
        stream.write_all(&go)?;
        let mut size = None;
        loop {
            let mut header = [0u8; 20];
            stream.read_exact(&mut header)?;
            let reply = u32::from_be_bytes(header[12..16].try_into().expect("4"));
            let length = u32::from_be_bytes(header[16..20].try_into().expect("4")) as usize;
            let mut data = vec![0u8; length];
            stream.read_exact(&mut data)?;
            match reply {
                REP_ACK => break,
                REP_INFO if data.len() >= 12 && data[0..2] == [0, 0] => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().expect("8")));
                }
                REP_INFO => {}
                other => return Err(protocol(format!("GO failed: reply {other:#x}"))),
            }
        }
        let size = size.ok_or_else(|| protocol("no NBD_INFO_EXPORT".into()))?;
        Ok(Client {
            stream,
            size,
            next_handle: 1,
        })
    }

    fn request(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> io::Result<u64> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut out = Vec::with_capacity(28 + data.len());
        out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&command.to_be_bytes());
        out.extend_from_slice(&handle.to_be_bytes());
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(data);
        self.stream.write_all(&out)?;
        Ok(handle)
    }

    fn reply(&mut self, handle: u64, data: &mut [u8]) -> io::Result<()> {
        let mut header = [0u8; 16];
        self.stream.read_exact(&mut header)?;
        if header[0..4] != SIMPLE_REPLY_MAGIC.to_be_bytes() {
            return Err(protocol("bad reply magic".into()));
        }
        let error = u32::from_be_bytes(header[4..8].try_into().expect("4"));
        if u64::from_be_bytes(header[8..16].try_into().expect("8")) != handle {
            return Err(protocol("reply for another handle".into()));
        }
        if error != 0 {
            return Err(io::Error::other(format!("server error {error}")));
        }
        self.stream.read_exact(data)
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let flags = if fua { FLAG_FUA } else { 0 };
        let handle = self.request(flags, CMD_WRITE, offset, data.len() as u32, data)?;
        self.reply(handle, &mut [])
    }

    pub fn flush(&mut self) -> io::Result<()> {
        let handle = self.request(0, CMD_FLUSH, 0, 0, &[])?;
        self.reply(handle, &mut [])
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let handle = self.request(0, CMD_READ, offset, buf.len() as u32, &[])?;
        self.reply(handle, buf)
    }

    pub fn disconnect(mut self) {
        let _ = self.request(0, CMD_DISC, 0, 0, &[]);
    }
}
