// The parts of ECharts the page uses (web/static: chart.js, heatmap.js), as the global `echarts`.
import * as echarts from "echarts/core";
import { LineChart, ScatterChart, CustomChart, HeatmapChart } from "echarts/charts";
import { GridComponent, TooltipComponent, LegendScrollComponent, DataZoomInsideComponent, DataZoomSliderComponent,
  MarkLineComponent, VisualMapContinuousComponent } from "echarts/components";
import { CanvasRenderer } from "echarts/renderers";

echarts.use([LineChart, ScatterChart, CustomChart, HeatmapChart, GridComponent, TooltipComponent, LegendScrollComponent,
  DataZoomInsideComponent, DataZoomSliderComponent, MarkLineComponent, VisualMapContinuousComponent, CanvasRenderer]);
window.echarts = echarts;
