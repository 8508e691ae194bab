//! Asking libxml nodes what they are, by namespace and local name.

use libxml::tree::Node;

/// Whether `node` is the element `local` of namespace `ns`.
pub(crate) fn is(node: &Node, ns: &str, local: &str) -> bool {
    node.get_name() == local && node.get_namespace().is_some_and(|n| n.get_href() == ns)
}

/// The child elements of `node` that are `ns`'s `local`.
pub(crate) fn child_elements<'a>(node: &'a Node, ns: &'a str, local: &'a str) -> impl Iterator<Item = Node> + 'a {
    node.get_child_elements().into_iter().filter(move |c| is(c, ns, local))
}
