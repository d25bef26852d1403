//! The local stack behind `make run`: `template.yaml` provisioned on real emulators
//! (DynamoDB Local, moto) and the functions run in-process behind emulations of the
//! managed triggers AWS would put in front of them.

pub mod model;
pub mod resolve;
pub mod template;
