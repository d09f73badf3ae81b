//! The run over time as an SVG: throughput (offered, accepted, delivered per second) above,
//! latency (accept p99, accept → ACCEPTED p99 per second) below, chaos steps marked in both.
//! And a soak's table sizes and throughput over time.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::report::Report;
use crate::soak::SoakReport;

const OFFERED: RGBColor = RGBColor(200, 200, 200);
const ACCEPTED: RGBColor = RGBColor(31, 119, 180);
const DELIVERED: RGBColor = RGBColor(44, 160, 44);
const CHAOS: RGBColor = RGBColor(214, 39, 40);

pub fn draw(report: &Report, path: &Path) -> anyhow::Result<()> {
    draw_svg(report, path).map_err(|err| anyhow::anyhow!("drawing {}: {err}", path.display()))
}

type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

fn draw_svg(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1100, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(380);
    let t = &report.timeline;
    let point = |f: &dyn Fn(&crate::report::TimelineSecond) -> f64| -> Vec<(f64, f64)> {
        t.iter().map(|s| (s.second as f64 + 0.5, f(s))).collect()
    };
    let throughput: Vec<Series> = vec![
        ("offered msg/s", OFFERED, point(&|s| s.offered as f64)),
        (
            "accepted (2xx) msg/s",
            ACCEPTED,
            point(&|s| s.accepted as f64),
        ),
        (
            "delivered (ACCEPTED) msg/s",
            DELIVERED,
            point(&|s| s.delivered as f64),
        ),
    ];
    let latency: Vec<Series> = vec![
        ("accept p99 ms", ACCEPTED, point(&|s| s.accept_p99_ms)),
        (
            "accept → ACCEPTED p99 ms (by accept second)",
            DELIVERED,
            point(&|s| s.end_to_end_p99_ms),
        ),
    ];
    let seconds = (t.len() as f64).max(1.0);
    panel(
        &top,
        &format!("{}: throughput", report.name),
        "messages / s",
        seconds,
        &throughput,
        report,
    )?;
    panel(
        &bottom,
        &format!("{}: latency", report.name),
        "milliseconds",
        seconds,
        &latency,
        report,
    )?;
    root.present()?;
    Ok(())
}

/// The y axis' top: 15 % above the highest point (at least 1).
fn top_of<'a>(series: impl Iterator<Item = &'a Vec<(f64, f64)>>) -> f64 {
    series
        .flat_map(|points| points.iter().map(|(_, y)| *y))
        .fold(1.0f64, f64::max)
        * 1.15
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A panel's titled, meshed chart over the run's seconds and `0..top` of `unit`.
fn frame<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    unit: &str,
    seconds: f64,
    top: f64,
) -> Result<Chart<'a, DB>, Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..seconds, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .y_desc(unit)
        .draw()?;
    Ok(chart)
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    unit: &str,
    seconds: f64,
    series: &[Series],
    report: &Report,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let top = top_of(series.iter().map(|(_, _, points)| points));
    let mut chart = frame(area, title, unit, seconds, top)?;
    for (label, color, points) in series {
        let color = *color;
        // Offered is drawn wide underneath, so it shows where accepted covers it.
        let width = if color == OFFERED { 6 } else { 2 };
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(width)))?
            .label(*label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    for (n, step) in report.chaos.iter().enumerate() {
        chart.draw_series(std::iter::once(Rectangle::new(
            [
                (step.started_s, 0.0),
                (step.ended_s.max(step.started_s + 0.1), top),
            ],
            CHAOS.mix(0.12).filled(),
        )))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(step.started_s, 0.0), (step.started_s, top)],
            CHAOS.stroke_width(2),
        )))?;
        let y = top * (0.95 - 0.07 * (n % 4) as f64);
        chart.draw_series(std::iter::once(Text::new(
            step.step.clone(),
            (step.started_s + seconds * 0.005, y),
            ("sans-serif", 13).into_font().color(&CHAOS),
        )))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

const TABLE_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A soak as an SVG: sizes over time above (the total and each table, MB), throughput per
/// sample below, the start of the judged period marked.
pub fn draw_soak(report: &SoakReport, path: &Path) -> anyhow::Result<()> {
    draw_soak_svg(report, path).map_err(|err| anyhow::anyhow!("drawing {}: {err}", path.display()))
}

fn draw_soak_svg(report: &SoakReport, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1100, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(420);
    let end = report
        .samples
        .last()
        .map(|s| s.at_s)
        .unwrap_or(1.0)
        .max(1.0);
    let mb = |b: i64| b as f64 / 1_048_576.0;
    let mut sizes: Vec<SoakSeries> = vec![(
        "all tables".to_owned(),
        BLACK,
        report
            .samples
            .iter()
            .map(|s| (s.at_s, mb(s.total_bytes())))
            .collect(),
    )];
    for (n, table) in crate::soak::TABLES.iter().enumerate() {
        sizes.push((
            (*table).to_owned(),
            TABLE_COLORS[n % TABLE_COLORS.len()],
            report
                .samples
                .iter()
                .map(|s| {
                    (
                        s.at_s,
                        mb(s.tables.get(*table).map(|t| t.bytes).unwrap_or(0)),
                    )
                })
                .collect(),
        ));
    }
    let rates = |f: fn(&crate::soak::SizeSample) -> i64| -> Vec<(f64, f64)> {
        report
            .samples
            .windows(2)
            .map(|w| {
                let dt = (w[1].at_s - w[0].at_s).max(0.001);
                (w[1].at_s, (f(&w[1]) - f(&w[0])) as f64 / dt)
            })
            .collect()
    };
    let throughput = vec![
        (
            "accepted msg/s".to_owned(),
            TABLE_COLORS[0],
            rates(|s| s.accepted),
        ),
        (
            "delivered (ledger rows) msg/s".to_owned(),
            TABLE_COLORS[2],
            rates(|s| s.delivered),
        ),
    ];
    soak_panel(
        &top,
        &format!(
            "soak at {:.0} msg/s, retention {:.0}s: table sizes",
            report.rate, report.retention_s
        ),
        "MB (heap + indexes)",
        end,
        &sizes,
        report.steady_from_s,
    )?;
    soak_panel(
        &bottom,
        "throughput",
        "messages / s",
        end,
        &throughput,
        report.steady_from_s,
    )?;
    root.present()?;
    Ok(())
}

type SoakSeries = (String, RGBColor, Vec<(f64, f64)>);

fn soak_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    unit: &str,
    seconds: f64,
    series: &[SoakSeries],
    steady_from: f64,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let top = top_of(series.iter().map(|(_, _, points)| points));
    let mut chart = frame(area, title, unit, seconds, top)?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(steady_from, 0.0), (steady_from, top)],
        BLACK.mix(0.4).stroke_width(1),
    )))?;
    for (label, color, points) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
