//! How an array comes to run: `create` writes md's metadata on new members, `assemble` reads
//! it back, checks the members agree and builds the running array (journal replay included).

pub(crate) mod assemble;
pub(crate) mod create;
pub(crate) mod leave;
