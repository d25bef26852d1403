//! The release Lambda: wiring only. The behaviour lives in the library.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    flashsale_lambda::serve::<flashsale_release::Deps>().await
}
