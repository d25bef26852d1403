//! The grab Lambda: wiring only. The behaviour lives in the library.

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    flashsale_lambda::serve_http::<flashsale_grab::Deps>().await
}
