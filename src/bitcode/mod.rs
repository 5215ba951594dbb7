//! A reader and writer for the LLVM bitstream container, enough to read and rewrite the module paths of
//! ThinLTO index shards and to read a module's hash.
