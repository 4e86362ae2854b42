//! EC2's XML answers as a small element tree, read with quick-xml's pull parser.
//!
//! Answers are a few kilobytes, and the instance set reads a handful of fields from each, so a
//! tree with lookups by element name serves better than a serde model of EC2's shapes: fields
//! moto or EC2 add later are ignored, and a missing one is a clear error.

use quick_xml::events::Event;

/// One element: its local name (namespaces dropped), its text, its children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Element {
    pub(crate) name: String,
    pub(crate) text: String,
    pub(crate) children: Vec<Element>,
}

impl Element {
    /// The first child named `name`.
    pub(crate) fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// The children named `name`.
    pub(crate) fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The element at `path` (child names, one per level).
    pub(crate) fn at(&self, path: &[&str]) -> Option<&Element> {
        path.iter().try_fold(self, |element, name| element.child(name))
    }

    /// The text at `path`, if the element is there and not empty.
    pub(crate) fn text_at(&self, path: &[&str]) -> Option<&str> {
        self.at(path).map(|e| e.text.as_str()).filter(|t| !t.is_empty())
    }

    /// The `item` children of the list at `path` (EC2's `fooSet`s), none if absent.
    pub(crate) fn items<'a>(&'a self, path: &[&str]) -> Vec<&'a Element> {
        self.at(path).map(|set| set.children("item").collect()).unwrap_or_default()
    }
}

/// The document's root element.
pub(crate) fn parse(text: &str) -> Result<Element, String> {
    let mut reader = quick_xml::Reader::from_str(text);
    let mut stack: Vec<Element> = vec![Element::default()];
    loop {
        let event = reader
            .read_event()
            .map_err(|e| format!("malformed XML at byte {}: {e}", reader.buffer_position()))?;
        match event {
            Event::Start(start) => {
                let name = start.local_name().as_ref().to_owned();
                stack.push(Element { name, ..Element::default() });
            }
            Event::Empty(empty) => {
                let name = empty.local_name().as_ref().to_owned();
                if let Some(parent) = stack.last_mut() {
                    parent.children.push(Element { name, ..Element::default() });
                }
            }
            Event::End(_) => {
                let done = stack.pop().ok_or("unbalanced XML")?;
                let parent = stack.last_mut().ok_or("unbalanced XML: a closing tag too many")?;
                parent.children.push(Element { text: done.text.trim().to_owned(), ..done });
            }
            Event::Text(text) => {
                if let Some(current) = stack.last_mut() {
                    current.text.push_str(&text);
                }
            }
            Event::CData(data) => {
                if let Some(current) = stack.last_mut() {
                    current.text.push_str(&data);
                }
            }
            Event::GeneralRef(reference) => {
                let resolved = match reference.resolve_char_ref() {
                    Ok(Some(c)) => c,
                    _ => match &*reference {
                        "amp" => '&',
                        "lt" => '<',
                        "gt" => '>',
                        "quot" => '"',
                        "apos" => '\'',
                        other => return Err(format!("unknown XML entity &{other};")),
                    },
                };
                if let Some(current) = stack.last_mut() {
                    current.text.push(resolved);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if stack.len() != 1 {
        return Err("truncated XML: an element is not closed".into());
    }
    let document = stack.pop().unwrap_or_default();
    document.children.into_iter().next().ok_or_else(|| "empty XML document".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nested_sets_entities_and_empty_elements() {
        let root = parse(
            "<?xml version=\"1.0\"?>\n<R xmlns=\"http://ec2\"><set><item><k>a &amp; b&#33;</k><e/></item>\
             <item><k><![CDATA[<c>]]></k></item></set></R>",
        )
        .unwrap();
        assert_eq!(root.name, "R");
        let items = root.items(&["set"]);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].text_at(&["k"]), Some("a & b!"));
        assert!(items[0].child("e").is_some());
        assert_eq!(items[0].text_at(&["e"]), None);
        assert_eq!(items[1].text_at(&["k"]), Some("<c>"));
    }

    #[test]
    fn broken_documents_are_errors() {
        assert!(parse("<a><b></a>").is_err());
        assert!(parse("<a><b>").is_err());
        assert!(parse("").is_err());
    }
}
