//! The stand-in terdut-server as a program, for `deploy/run-local.sh`: an
//! empty install on `127.0.0.1:<free port>` (plain HTTP). Prints its base
//! URL on the first line of stdout and serves until killed.

use std::io::Write;

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let standin = terdut_standin::StandIn::start().await?;
        let mut out = std::io::stdout();
        writeln!(out, "{}", standin.url())?;
        out.flush()?;
        std::future::pending::<()>().await;
        drop(standin);
        Ok(())
    })
}
