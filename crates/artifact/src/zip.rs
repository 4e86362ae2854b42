//! A small zip reader: the central directory, stored and deflated entries, unix modes and
//! links; enough for the archives artifacts are, without a zip crate and its codecs.
//!
//! Refused: zip64 archives, encrypted entries, compression methods other than stored (0) and
//! deflate (8), and entries whose size or CRC-32 does not match the directory.

use flate2::Crc;
use flate2::read::DeflateDecoder;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

const END_OF_DIRECTORY: [u8; 4] = *b"PK\x05\x06";
const DIRECTORY_ENTRY: [u8; 4] = *b"PK\x01\x02";
const LOCAL_HEADER: [u8; 4] = *b"PK\x03\x04";
/// The end record's fixed part; a comment of up to 64 KiB may follow it.
const END_LEN: usize = 22;
/// The longest link target read from an entry.
const MAX_LINK: u64 = 4096;

/// One entry of the central directory.
struct Entry {
    name: String,
    made_by_unix: bool,
    flags: u16,
    method: u16,
    crc: u32,
    compressed: u64,
    size: u64,
    external: u32,
    local_offset: u64,
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Where a zip's entries go; the unpacker, which keeps them inside its destination.
pub(crate) trait Entries {
    /// A directory.
    fn dir(&mut self, name: &str) -> Result<(), String>;
    /// A regular file with its content and mode.
    fn file(&mut self, name: &str, content: &mut dyn Read, mode: u32) -> Result<(), String>;
    /// A symbolic link.
    fn symlink(&mut self, name: &str, target: &str) -> Result<(), String>;
}

/// Unpacks the zip archive `file` into `unpacker`.
pub(crate) fn unpack(mut file: File, unpacker: &mut dyn Entries) -> Result<(), String> {
    for entry in directory(&mut file)? {
        let mode = entry.made_by_unix.then_some(entry.external >> 16).filter(|m| *m != 0);
        let kind = mode.map_or(0, |m| m & 0o170_000);
        if entry.flags & 1 != 0 {
            return Err(format!("entry {:?} is encrypted", entry.name));
        }
        if entry.name.ends_with('/') || kind == 0o040_000 {
            unpacker.dir(&entry.name)?;
            continue;
        }
        let mut content = content(&mut file, &entry)?;
        if kind == 0o120_000 {
            let mut target = String::new();
            content
                .by_ref()
                .take(MAX_LINK)
                .read_to_string(&mut target)
                .map_err(|e| format!("link {:?}: {e}", entry.name))?;
            content.finish()?;
            unpacker.symlink(&entry.name, &target)?;
        } else if kind == 0 || kind == 0o100_000 {
            unpacker.file(&entry.name, &mut content, mode.unwrap_or(0o644))?;
            content.finish()?;
        } else {
            return Err(format!("entry {:?} is of a refused kind", entry.name));
        }
    }
    Ok(())
}

/// Reads the central directory.
fn directory(file: &mut File) -> Result<Vec<Entry>, String> {
    let damaged = |what: &str| format!("not a zip archive, or a damaged one: {what}");
    let len = file.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    let tail_len = len.min((END_LEN + usize::from(u16::MAX)) as u64);
    let mut tail = vec![0; tail_len as usize];
    file.seek(SeekFrom::Start(len - tail_len)).map_err(|e| e.to_string())?;
    file.read_exact(&mut tail).map_err(|e| e.to_string())?;
    let end = (0..=tail.len().saturating_sub(END_LEN))
        .rev()
        .find(|&at| tail[at..at + 4] == END_OF_DIRECTORY)
        .ok_or_else(|| damaged("no end of central directory"))?;
    let end = &tail[end..];
    let count = u16_at(end, 10);
    let (size, offset) = (u32_at(end, 12), u32_at(end, 16));
    if count == u16::MAX || size == u32::MAX || offset == u32::MAX {
        return Err("zip64 archives are not supported".into());
    }
    if u64::from(offset) + u64::from(size) > len {
        return Err(damaged("the central directory lies past the end"));
    }
    let mut directory = vec![0; size as usize];
    file.seek(SeekFrom::Start(offset.into())).map_err(|e| e.to_string())?;
    file.read_exact(&mut directory).map_err(|e| e.to_string())?;
    let mut entries = Vec::with_capacity(count.into());
    let mut at = 0;
    for _ in 0..count {
        if at + 46 > directory.len() || directory[at..at + 4] != DIRECTORY_ENTRY {
            return Err(damaged("a central directory entry is cut short"));
        }
        let header = &directory[at..];
        let (name_len, extra_len, comment_len) =
            (u16_at(header, 28) as usize, u16_at(header, 30) as usize, u16_at(header, 32) as usize);
        let name =
            header.get(46..46 + name_len).ok_or_else(|| damaged("an entry's name is cut short"))?;
        entries.push(Entry {
            name: String::from_utf8_lossy(name).into_owned(),
            made_by_unix: header[5] == 3,
            flags: u16_at(header, 8),
            method: u16_at(header, 10),
            crc: u32_at(header, 16),
            compressed: u32_at(header, 20).into(),
            size: u32_at(header, 24).into(),
            external: u32_at(header, 38),
            local_offset: u32_at(header, 42).into(),
        });
        at += 46 + name_len + extra_len + comment_len;
    }
    Ok(entries)
}

/// An entry's content as it is read, with its size and CRC-32 checked at the end.
struct Content<'a> {
    reader: Box<dyn Read + 'a>,
    crc: Crc,
    name: String,
    crc_expected: u32,
    size_expected: u64,
}

impl Read for Content<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.reader.read(buf)?;
        self.crc.update(&buf[..read]);
        Ok(read)
    }
}

impl Content<'_> {
    /// Reads what is left and checks size and CRC-32 against the directory.
    fn finish(mut self) -> Result<(), String> {
        std::io::copy(&mut self, &mut std::io::sink()).map_err(|e| e.to_string())?;
        if u64::from(self.crc.amount()) != self.size_expected & 0xffff_ffff
            || self.crc.sum() != self.crc_expected
        {
            return Err(format!("entry {:?} is damaged (size or CRC-32)", self.name));
        }
        Ok(())
    }
}

fn content<'a>(file: &'a mut File, entry: &Entry) -> Result<Content<'a>, String> {
    let mut header = [0; 30];
    file.seek(SeekFrom::Start(entry.local_offset)).map_err(|e| e.to_string())?;
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    if header[..4] != LOCAL_HEADER {
        return Err(format!("entry {:?}: no local header where the directory says", entry.name));
    }
    let skip = i64::from(u16_at(&header, 26)) + i64::from(u16_at(&header, 28));
    file.seek(SeekFrom::Current(skip)).map_err(|e| e.to_string())?;
    let raw = file.take(entry.compressed);
    let reader: Box<dyn Read> = match entry.method {
        0 => Box::new(raw),
        8 => Box::new(DeflateDecoder::new(raw).take(entry.size)),
        other => {
            return Err(format!(
                "entry {:?} uses compression method {other}; only stored and deflate are read",
                entry.name
            ));
        }
    };
    Ok(Content {
        reader,
        crc: Crc::new(),
        name: entry.name.clone(),
        crc_expected: entry.crc,
        size_expected: entry.size,
    })
}
